package demo

import (
	"bytes"
	"context"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
	checkFrames(t, s, 2)
}

func TestDemoRejectsBadSites(t *testing.T) {
	if err := Run(context.Background(), Options{Sites: 4}); err == nil {
		t.Error("accepted 4 sites")
	}
}

// TestDemoStoryShowsShedding: the story plays every act, the overload
// included: the grid sheds (429) during it, on whatever machine runs it
// (the act overloads on the capacity the grid has shown, not on its
// nominal slots), and every act is announced. The run ends when the last
// act has been announced, not at a wall-clock time, so a busy machine that
// plays the story slower still passes; README's `--duration 60s` is the
// story's length on an idle one.
func TestDemoStoryShowsShedding(t *testing.T) {
	if testing.Short() {
		t.Skip("a 60 s demo")
	}
	t.Setenv("TMPDIR", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out := &untilWriter{until: "demand back to 70%", then: cancel}
	if err := Run(ctx, Options{Sites: 3, Out: out}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !out.seen() {
		t.Errorf("the story did not reach its last act in 4 minutes:\n%s", s[max(0, len(s)-3000):])
	}
	m := regexp.MustCompile(`requests: \d+ served, (\d+) shed \(429\)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no summary:\n%s", s)
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Errorf("the story never shed:\n%s", s[max(0, len(s)-3000):])
	}
	for _, act := range []string{"burst:", "is excluded", "rejoins", "watch it shed", "demand back to 70%"} {
		if !strings.Contains(s, act) {
			t.Errorf("the story did not announce %q", act)
		}
	}
	checkFrames(t, s, 3)
}

// untilWriter keeps what is written and calls then once until appears.
type untilWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	until string
	then  func()
	found bool
}

func (w *untilWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.found && bytes.Contains(p, []byte(w.until)) {
		w.found = true
		w.then()
	}
	return len(p), nil
}

func (w *untilWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func (w *untilWriter) seen() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.found
}

// checkFrames holds the live view to its legend: every frame keeps the
// opening block (each site's addresses), its header has every column the
// legend explains, and every row's BUSY is its RUN over its SLOTS.
func checkFrames(t *testing.T, out string, sites int) {
	t.Helper()
	frames := strings.Split(out, "\nt=")[1:]
	if len(frames) < 3 {
		t.Fatalf("%d frames:\n%s", len(frames), out)
	}
	row := regexp.MustCompile(`^\s*(\S+)\s+(\d+)\s+(?:\S+\s+)?(\d+)\s+(\d+)\s+(\d+)%`)
	for i, f := range frames {
		f = strings.SplitN(f, "\n\nsummary", 2)[0]
		if i+1 < len(frames) && strings.Count(f, "operator http://") != sites {
			t.Errorf("frame %d does not keep the opening block:\n%s", i, f)
		}
		lines := strings.Split(f, "\n")
		header := ""
		for _, l := range lines {
			if strings.Contains(l, "SITE") && strings.Contains(l, "SLOTS") {
				header = l
			}
		}
		legend := f[strings.Index(f, "At the engines"):]
		for _, col := range []string{"RUN", "WAIT", "BUSY", "CEILING", "RHO", "PICKS", "TTFT"} {
			if !strings.Contains(header, col) || !strings.Contains(legend, col) {
				t.Errorf("frame %d: column %s missing from the header %q or the legend", i, col, header)
			}
		}
		rows := 0
		for _, l := range lines {
			m := row.FindStringSubmatch(l)
			if m == nil || m[1] == "SITE" {
				continue
			}
			rows++
			slots, _ := strconv.Atoi(m[2])
			run, _ := strconv.Atoi(m[3])
			busy, _ := strconv.Atoi(m[5])
			if want := 100 * float64(run) / float64(slots); math.Abs(float64(busy)-want) > 0.5 {
				t.Errorf("frame %d: %q: BUSY %d%%, but RUN/SLOTS is %.1f%%", i, l, busy, want)
			}
		}
		if rows != sites+1 {
			t.Errorf("frame %d: %d rows with BUSY, want one a site and the total:\n%s", i, rows, f)
		}
	}
}
