package repocheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// policyFiles are the files of internal/route that each hold one routing
// policy: what they export is the policy's own, reached by the gateway only
// through the Policy seam (route.NewPolicy, route.Policy).
var policyFiles = []string{"ageaware.go", "reference.go"}

// exported lists the exported top-level names declared in files.
func exported(t *testing.T, dir string, files []string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names[s.Name.Name] = true
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names[n.Name] = true
							}
						}
					}
				}
			}
		}
	}
	return names
}

// routeUses lists, per file, the names of internal/route the non-test Go
// files of dir select (route.X).
func routeUses(t *testing.T, dir string) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	uses := map[string][]string{}
	matches, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, path := range matches {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		local := ""
		for _, imp := range f.Imports {
			if strings.Trim(imp.Path.Value, `"`) == module+"internal/route" {
				local = "route"
				if imp.Name != nil {
					local = imp.Name.Name
				}
			}
		}
		if local == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == local {
					uses[filepath.Base(path)] = append(uses[filepath.Base(path)], sel.Sel.Name)
				}
			}
			return true
		})
	}
	return uses
}

// TestGatewayKnowsTheSeamNotThePolicies: the gateway chooses a policy by
// name and hands it to the builder; it names no policy's type, constructor
// or constant, so a policy can change (or one be added) without touching
// the gateway (docs/routing.md).
func TestGatewayKnowsTheSeamNotThePolicies(t *testing.T) {
	root := filepath.Join("..", "..")
	own := exported(t, filepath.Join(root, "internal", "route"), policyFiles)
	if !own["AgeAware"] || !own["Reference"] {
		t.Fatalf("the policies' names were not read (%v): the test's view of internal/route is wrong", own)
	}
	uses := routeUses(t, filepath.Join(root, "internal", "gateway"))
	if len(uses) == 0 {
		t.Fatal("the gateway selects nothing of internal/route: the test's view of the gateway is wrong")
	}
	var files []string
	for f := range uses {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		for _, name := range uses[f] {
			if own[name] {
				t.Errorf("internal/gateway/%s names route.%s, a policy's own: choose policies with route.NewPolicy and hold them as route.Policy", f, name)
			}
		}
	}
}

// TestSeamCheckCanFail: the walker finds a policy's name where a file
// selects it.
func TestSeamCheckCanFail(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "x.go"), "package x\n\nimport \"github.com/grid-inference/grid/internal/route\"\n\nvar _ = route.NewAgeAware\n")
	if got := routeUses(t, dir)["x.go"]; len(got) != 1 || got[0] != "NewAgeAware" {
		t.Fatalf("uses %v, want [NewAgeAware]", got)
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
