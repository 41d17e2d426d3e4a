package demo

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemoRunsAndCleansUp runs a short demo: requests are served, the view
// fits 80 columns, and nothing is left behind (goroutines, temp dirs). The
// demo runs in a temporary directory of its own, so another demo on the
// machine cannot make it pass or fail.
func TestDemoRunsAndCleansUp(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var out bytes.Buffer
	err := Run(context.Background(), Options{Duration: 6 * time.Second, Sites: 2, NoStory: true, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	m := regexp.MustCompile(`requests: (\d+) served`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no summary:\n%s", s)
	}
	if n, _ := strconv.Atoi(m[1]); n < 50 {
		t.Errorf("only %d requests served in 6s:\n%s", n, s)
	}
	for _, line := range strings.Split(s, "\n") {
		if len([]rune(line)) > 80 && !strings.Contains(line, "http://") {
			t.Errorf("view line wider than 80 columns: %q", line)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temporary directory: %v", left)
	}
}

func TestDemoRejectsBadSites(t *testing.T) {
	if err := Run(context.Background(), Options{Sites: 4}); err == nil {
		t.Error("accepted 4 sites")
	}
}

// TestDemoStoryShowsShedding: the README's `--duration 60s` shows the whole
// story, the overload act included: the grid sheds (429) before the run
// ends, on whatever machine runs it (the act overloads on the capacity the
// grid has shown, not on its nominal slots), and every act is announced.
func TestDemoStoryShowsShedding(t *testing.T) {
	if testing.Short() {
		t.Skip("a 60 s demo")
	}
	t.Setenv("TMPDIR", t.TempDir())
	var out bytes.Buffer
	if err := Run(context.Background(), Options{Duration: 60 * time.Second, Sites: 3, Out: &out}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	m := regexp.MustCompile(`requests: \d+ served, (\d+) shed \(429\)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no summary:\n%s", s)
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Errorf("the 60 s story never shed:\n%s", s[max(0, len(s)-3000):])
	}
	for _, act := range []string{"burst:", "is excluded", "rejoins", "watch it shed", "demand back to 70%"} {
		if !strings.Contains(s, act) {
			t.Errorf("the story did not announce %q", act)
		}
	}
}
