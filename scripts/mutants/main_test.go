package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestMutantsApply keeps the table applicable as the code moves: every
// mutant's `from` occurs exactly once in its file, and changes it.
func TestMutantsApply(t *testing.T) {
	ms, err := Load("mutants.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		b, err := os.ReadFile(filepath.Join("..", "..", m.File))
		if err != nil {
			t.Errorf("%s: %v", m.Rule, err)
			continue
		}
		if n := bytes.Count(b, []byte(m.From)); n != 1 {
			t.Errorf("%s: `from` occurs %d times in %s, want once", m.Rule, n, m.File)
		}
		if m.From == m.To || m.Rule == "" || m.Package == "" || m.Section == "" {
			t.Errorf("%s: an entry needs a section, a rule, a package and a change", m.Rule)
		}
	}
}

// TestEveryProtocolRuleHasAMutant: each section of docs/protocol.md §4 (the
// algorithms) has at least one mutant, and no mutant names a section that
// is not there.
func TestEveryProtocolRuleHasAMutant(t *testing.T) {
	ms, err := Load("mutants.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^### (4\.\d+) `).FindAllSubmatch(doc, -1) {
		sections[string(m[1])] = 0
	}
	if len(sections) < 10 {
		t.Fatalf("found %d sections of §4", len(sections))
	}
	for _, m := range ms {
		if _, ok := sections[m.Section]; !ok {
			t.Errorf("%s: §%s is not a section of docs/protocol.md §4", m.Rule, m.Section)
		}
		sections[m.Section]++
	}
	for s, n := range sections {
		if n == 0 {
			t.Errorf("§%s has no mutant", s)
		}
	}
}
