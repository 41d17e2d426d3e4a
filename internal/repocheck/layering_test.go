package repocheck

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/grid-inference/grid/"

// The two sides, by package path below the module.
var (
	gatewaySide  = []string{"internal/gateway", "internal/loadstore", "internal/route"}
	operatorSide = []string{"internal/operator", "internal/backend", "internal/readiness", "internal/latency"}
)

// graph maps each package of the module (path below the module) to the
// module packages its non-test files import.
func graph(t *testing.T) map[string][]string {
	t.Helper()
	root := filepath.Join("..", "..")
	g := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		if _, ok := g[pkg]; !ok {
			g[pkg] = nil
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if dep, ok := strings.CutPrefix(p, module); ok && !slices.Contains(g[pkg], dep) {
				g[pkg] = append(g[pkg], dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// reach returns every package pkg depends on, directly or transitively, with
// the import chain that reaches it.
func reach(g map[string][]string, pkg string) map[string][]string {
	chains := map[string][]string{}
	queue := []string{pkg}
	chains[pkg] = []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		deps := slices.Clone(g[p])
		sort.Strings(deps)
		for _, d := range deps {
			if _, seen := chains[d]; !seen {
				chains[d] = append(slices.Clone(chains[p]), d)
				queue = append(queue, d)
			}
		}
	}
	delete(chains, pkg)
	return chains
}

// under reports whether pkg is one of roots or below one of them.
func under(pkg string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return pkg == r || strings.HasPrefix(pkg, r+"/") })
}

func TestImportBoundaries(t *testing.T) {
	g := graph(t)
	for _, must := range append(append([]string{"internal/signals", "cmd/grid"}, gatewaySide...), operatorSide...) {
		if _, ok := g[must]; !ok {
			t.Fatalf("package %s not found: the test's view of the tree is wrong", must)
		}
	}
	rules := []struct {
		from, forbidden []string
		why             string
	}{
		{gatewaySide, operatorSide, "the gateway side shares only the signals contract and identity with the operator side"},
		{operatorSide, gatewaySide, "the operator side shares only the signals contract and identity with the gateway side"},
		{[]string{"internal/signals"}, append(append([]string{"internal/config"}, gatewaySide...), operatorSide...), "the contract depends on neither side nor on config"},
		{[]string{"internal", "api"}, []string{"cmd"}, "cmd/ only wires"},
	}
	for pkg := range g {
		for _, r := range rules {
			if !under(pkg, r.from) {
				continue
			}
			for dep, chain := range reach(g, pkg) {
				if under(dep, r.forbidden) {
					t.Errorf("%s depends on %s (%s): %s", pkg, dep, strings.Join(chain, " → "), r.why)
				}
			}
		}
	}
}

// TestRulesCanFail checks the walker on a graph that breaks a rule, so a
// silent walker cannot pass the test above.
func TestRulesCanFail(t *testing.T) {
	g := map[string][]string{
		"internal/gateway": {"internal/signals"},
		"internal/signals": {"internal/x"},
		"internal/x":       {"internal/backend"},
	}
	chain, ok := reach(g, "internal/gateway")["internal/backend"]
	if !ok || strings.Join(chain, " ") != "internal/gateway internal/signals internal/x internal/backend" {
		t.Fatalf("transitive dependency not found: %v", chain)
	}
	if !under("internal/signals/expo", []string{"internal/signals"}) || under("internal/signalsx", []string{"internal/signals"}) {
		t.Fatal("under() is wrong")
	}
}
