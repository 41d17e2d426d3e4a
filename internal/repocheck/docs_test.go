package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// mdLink is a Markdown link or image: [text](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// citedPath is a repository path named in prose or a comment.
	citedPath = regexp.MustCompile("(?:^|[\\s`(\"'])((?:docs|internal|cmd|examples|deploy|api|bench|\\.ci)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])")
	// protocolSection is a citation of a numbered section of the protocol.
	protocolSection = regexp.MustCompile(`protocol\.md §(\d+(?:\.\d+)*)`)
	// heading is a numbered heading of docs/protocol.md.
	heading = regexp.MustCompile(`(?m)^#{2,4} (\d+(?:\.\d+)*)\. |^#{2,4} (\d+(?:\.\d+)+) `)
)

// repoFiles lists the tracked-looking files below root with one of exts,
// skipping hidden directories other than .ci, and testdata.
func repoFiles(t *testing.T, root string, exts ...string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && ((strings.HasPrefix(name, ".") && name != ".ci") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		for _, e := range exts {
			if !d.IsDir() && strings.HasSuffix(name, e) {
				out = append(out, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// comments keeps the comment lines of Go source: string literals name
// paths of other kinds (URL paths, test fixtures of a fake tree).
func comments(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if _, c, ok := strings.Cut(line, "//"); ok && !strings.Contains(line, "\"") {
			b.WriteString(c)
			b.WriteByte('\n')
		} else if strings.HasPrefix(strings.TrimSpace(line), "//") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// protocolSections reads the section numbers docs/protocol.md has.
func protocolSections(t *testing.T, root string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
		have[m[1]+m[2]] = true
	}
	return have
}

// TestDocsCiteWhatExists: every relative link of the Markdown files, every
// repository path cited in them or in a Go comment, and every section of
// docs/protocol.md cited anywhere exists; nothing cites the design material
// that lives outside the repository.
func TestDocsCiteWhatExists(t *testing.T) {
	root := filepath.Join("..", "..")
	sections := protocolSections(t, root)
	if !sections["4.9"] || !sections["1"] || len(sections) < 30 {
		t.Fatalf("docs/protocol.md sections read wrong: %v", sections)
	}
	for _, file := range repoFiles(t, root, ".md", ".go") {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		rel, _ := filepath.Rel(root, file)
		for _, outside := range []string{"reference.md", "routing-under-staleness.md", "backends.md", "peers-notes.md"} {
			if strings.Contains(text, "spec"+"/"+outside) {
				t.Errorf("%s cites %s, design material outside the repository", rel, outside)
			}
		}
		if strings.HasSuffix(file, ".go") {
			text = comments(text)
		}
		if strings.HasSuffix(file, ".md") {
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				if !exists(filepath.Join(filepath.Dir(file), target)) {
					t.Errorf("%s links to %s, which does not exist", rel, m[1])
				}
			}
		}
		for _, m := range citedPath.FindAllStringSubmatch(text, -1) {
			p := strings.TrimSuffix(m[1], ".")
			if strings.ContainsAny(p, "*") || strings.Contains(p, "...") {
				continue
			}
			// A path is cited from the repository root, or (in a Markdown
			// file or a package) next to the citing file.
			if !exists(filepath.Join(root, p)) && !exists(filepath.Join(filepath.Dir(file), p)) {
				t.Errorf("%s cites %s, which does not exist", rel, p)
			}
		}
		for _, m := range protocolSection.FindAllStringSubmatch(text, -1) {
			if !sections[m[1]] {
				t.Errorf("%s cites docs/protocol.md §%s, which has no such section", rel, m[1])
			}
		}
	}
}

// ordinalDate is a finding dated by an ordinal of the team's own work
// periods ("the ninth session", "sessions 9–10"): a reader of the product
// has no such calendar, so findings are dated by commit.
var ordinalDate = regexp.MustCompile(`(?i)\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|\d+(?:st|nd|rd|th))\s+(?:session|work period|sitting)s?\b|\bsessions?\s+\d+\s*(?:[–-]\s*\d+|,)|\bsession\s+\d+\b(?:[^.\d]|$)`)

// TestDocsDateByCommit: no document dates a finding by an ordinal of work
// periods; BENCHMARKS.md and every page under docs/ are read.
func TestDocsDateByCommit(t *testing.T) {
	root := filepath.Join("..", "..")
	files := append(repoFiles(t, filepath.Join(root, "docs"), ".md"), filepath.Join(root, "BENCHMARKS.md"), filepath.Join(root, "README.md"))
	if len(files) < 5 {
		t.Fatalf("read %d documents: the test's view of the tree is wrong", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := ordinalDate.FindString(line); m != "" {
				rel, _ := filepath.Rel(root, f)
				t.Errorf("%s:%d dates a finding by %q: date it by commit", rel, i+1, m)
			}
		}
	}
}

// TestOrdinalDateCanFail: the pattern catches the forms seen, and passes
// figures that only look alike.
func TestOrdinalDateCanFail(t *testing.T) {
	for _, bad := range []string{"re-measured in the ninth session", "(Tenth session; the gateway", "sessions 9–10", "until the 11th session", "in session 10 the"} {
		if !ordinalDate.MatchString(bad) {
			t.Errorf("%q not caught", bad)
		}
	}
	for _, good := range []string{"none 20.2 / 148 ms, session 10.8 / 116", "a tenth of the throughput", "a session's first turn", "the first tenth is dropped"} {
		if ordinalDate.MatchString(good) {
			t.Errorf("%q caught", good)
		}
	}
}

// TestRoutingPageIsTheModel: docs/routing.md is the model on a few pages;
// what was tried belongs to the design record.
func TestRoutingPageIsTheModel(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "routing.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n >= 300 {
		t.Errorf("docs/routing.md is %d lines: keep the model under 300, and move what was tried to docs/design/routing-experiments.md", n)
	}
}
