// Command mutants is the project's mutation run: it breaks, one at a time,
// each rule listed in mutants.yaml (the rules of docs/protocol.md §4, at
// least one per section) in a copy of the module and expects a test of the
// rule's package to fail. A mutant whose package still passes is a rule no
// test holds.
//
// Usage (from the repository root):
//
//	go run ./scripts/mutants [-only SUBSTRING] [-markdown]
//
// It copies the module to a temporary directory (the working tree is never
// written), applies each mutation there (its `from` must occur exactly once
// in its file), runs `go test -short -failfast -count=1` on its package, and
// restores the file. It prints one line a mutant and the score, or with
// -markdown the table docs/testing.md keeps. The exit status is 1 when a
// mutant survived.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Mutant is one broken rule.
type Mutant struct {
	// Section is the docs/protocol.md section whose rule it breaks ("4.2").
	Section string `yaml:"section"`
	// Rule says, in words, what is broken.
	Rule string `yaml:"rule"`
	File string `yaml:"file"`
	// From is replaced by To; From must occur exactly once in File.
	From string `yaml:"from"`
	To   string `yaml:"to"`
	// Package is the package whose tests must catch it.
	Package string `yaml:"package"`
}

// Load reads the mutation table.
func Load(path string) ([]Mutant, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ms []Mutant
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&ms); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ms, nil
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

func main() {
	only := flag.String("only", "", "run only the mutants whose rule or file contains this")
	markdown := flag.Bool("markdown", false, "print the results as docs/testing.md's table")
	flag.Parse()
	ms, err := Load("scripts/mutants/mutants.yaml")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(2)
	}
	work, err := os.MkdirTemp("", "grid-mutants-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(2)
	}
	defer os.RemoveAll(work)
	if err := copyModule(".", work); err != nil {
		fmt.Fprintln(os.Stderr, "mutants: copy the module:", err)
		os.Exit(2)
	}
	caught, total := 0, 0
	if *markdown {
		fmt.Println("| § | rule broken | package | caught by |")
		fmt.Println("| --- | --- | --- | --- |")
	}
	for _, m := range ms {
		if *only != "" && !strings.Contains(m.Rule, *only) && !strings.Contains(m.File, *only) {
			continue
		}
		total++
		start := time.Now()
		by, err := run(work, m)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mutants: %s: %v\n", m.Rule, err)
			os.Exit(2)
		}
		if by != "" {
			caught++
		}
		switch {
		case *markdown:
			fmt.Printf("| %s | %s | `%s` | %s |\n", m.Section, m.Rule, m.Package, or(by, "**survived**"))
		default:
			fmt.Printf("%-9s §%-5s %s (%s, %.0fs)\n", map[bool]string{true: "caught", false: "SURVIVED"}[by != ""], m.Section, m.Rule,
				or(by, "no test failed"), time.Since(start).Seconds())
		}
	}
	fmt.Printf("\n%d of %d mutants caught\n", caught, total)
	if caught < total {
		os.Exit(1)
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// run applies m in work, tests its package and restores the file. It
// returns the tests that failed, "" when none did.
func run(work string, m Mutant) (string, error) {
	path := filepath.Join(work, m.File)
	orig, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if n := bytes.Count(orig, []byte(m.From)); n != 1 {
		return "", fmt.Errorf("%s: `from` occurs %d times, want once", m.File, n)
	}
	if err := os.WriteFile(path, bytes.Replace(orig, []byte(m.From), []byte(m.To), 1), 0o644); err != nil {
		return "", err
	}
	defer os.WriteFile(path, orig, 0o644)
	cmd := exec.Command("go", "test", "-short", "-failfast", "-count=1", m.Package)
	cmd.Dir = work
	out, err := cmd.CombinedOutput()
	if err == nil {
		return "", nil
	}
	var names []string
	for _, f := range failLine.FindAllStringSubmatch(string(out), -1) {
		if !strings.Contains(f[1], "/") || len(names) == 0 {
			names = append(names, "`"+f[1]+"`")
		}
	}
	if len(names) == 0 {
		if bytes.Contains(out, []byte("build failed")) || bytes.Contains(out, []byte("setup failed")) {
			return "", fmt.Errorf("the mutant does not build: %s", firstLine(out))
		}
		// The test binary failed outside a test (TestMain's leak check, a
		// panic in init).
		return "the package's tests (" + firstLine(out) + ")", nil
	}
	return strings.Join(names, ", "), nil
}

func firstLine(b []byte) string {
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}

// copyModule copies the module's files (not .git) to dst.
func copyModule(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			if rel == ".git" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
}
