package operator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grid-inference/grid/internal/config"
)

func providers(names ...string) []config.Provider {
	var out []config.Provider
	for _, n := range names {
		out = append(out, config.Provider{Name: n, Model: "m", Kind: "epp", Upstream: "http://u", Metrics: config.Metrics{Endpoint: "http://" + n}})
	}
	return out
}

func TestEpochRisesAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	s1, err := OpenState(dir, 5000, providers("a"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s1.Epoch != 5000 {
		t.Fatalf("first epoch %d, want the wall clock", s1.Epoch)
	}
	s1.Close()
	// The clock stepped back five minutes (within the ten receivers
	// admit): the epoch still rises. (Further back: TestEpochAheadHaltsPublication.)
	s2, err := OpenState(dir, 5000-300_000, providers("a"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s2.Epoch != 5001 {
		t.Fatalf("epoch after a clock step back %d, want 5001", s2.Epoch)
	}
	s2.Close()
	// The clock moved on: it wins.
	s3, _ := OpenState(dir, 9000, providers("a"), OpenOptions{})
	defer s3.Close()
	if s3.Epoch != 9000 {
		t.Fatalf("epoch %d, want 9000", s3.Epoch)
	}
	if s1.Revision("a").UID != s3.Revision("a").UID {
		t.Error("uid changed across restarts")
	}
}

func TestRevisions(t *testing.T) {
	dir := t.TempDir()
	s, _ := OpenState(dir, 1, providers("a", "b"), OpenOptions{})
	a, b := *s.Revision("a"), *s.Revision("b")
	if a.UID == b.UID || a.Generation != 1 {
		t.Fatalf("revisions %+v %+v", a, b)
	}
	// Unchanged config: same generation.
	s.Reconcile(providers("a", "b"))
	if s.Revision("a").Generation != 1 {
		t.Error("generation advanced without a change")
	}
	// Change a's block: its generation advances; b's does not.
	ps := providers("a", "b")
	ps[0].Metrics.PoolName = "other"
	s.Reconcile(ps)
	if s.Revision("a").Generation != 2 || s.Revision("b").Generation != 1 || s.Revision("a").UID != a.UID {
		t.Errorf("after a change: a %+v b %+v", s.Revision("a"), s.Revision("b"))
	}
	// Remove b and add it again: a new uid.
	s.Reconcile(providers("a"))
	s.Reconcile(providers("a", "b"))
	if s.Revision("b").UID == b.UID {
		t.Error("re-added provider kept its uid")
	}
	if got := strings.Join(s.names(), ","); got != "a,b" {
		t.Errorf("names %s", got)
	}
}

// TestReloadWhileScraping: a reload (SIGHUP) reconciles the providers on
// its own goroutine while scrapes publish with their revisions; under the
// race detector this failed before State had its lock (and a map written
// while read can crash the process). A revision handed out stays as it
// was when a later reload advances the generation.
func TestReloadWhileScraping(t *testing.T) {
	s, err := NewObjectState(1, providers("a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	changed := providers("a", "b")
	changed[0].Metrics.PoolName = "other"
	held := s.Revision("a")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			if i%2 == 0 {
				s.Reconcile(changed)
			} else {
				s.Reconcile(providers("a"))
			}
		}
	}()
	for range 200 {
		if rev := s.Revision("a"); rev == nil || rev.Generation < 1 {
			t.Fatalf("revision of a during reloads: %+v", rev)
		}
		s.Revision("b") // removed and re-added by the reloads
	}
	<-done
	if held.Generation != 1 {
		t.Errorf("a revision handed out before the reloads changed under its holder: %+v", held)
	}
}

func TestCorruptStateRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, stateFile), []byte("{not json"), 0o600)
	_, err := OpenState(dir, 1, nil, OpenOptions{})
	if err == nil || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "delete it") {
		t.Fatalf("error %v", err)
	}
}

func TestStateWrittenBeforeUse(t *testing.T) {
	dir := t.TempDir()
	s, _ := OpenState(dir, 42, providers("a"), OpenOptions{})
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil || !strings.Contains(string(data), `"publisherEpoch": 42`) || !strings.Contains(string(data), s.Revision("a").UID) {
		t.Fatalf("state on disk %s (%v)", data, err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, "*.tmp-*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

// TestObjectStateTakesRevisionsFromObjects: in Kubernetes mode a provider's
// revision is its object's uid and generation, whatever its config hash
// says, and nothing is written to disk.
func TestObjectStateTakesRevisionsFromObjects(t *testing.T) {
	p := config.Provider{Name: "qwen", Model: "m", Object: &config.ObjectRevision{UID: "uid-1", Generation: 4}}
	s, err := NewObjectState(12345, []config.Provider{p})
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Revision("qwen"); s.Epoch != 12345 || r.UID != "uid-1" || r.Generation != 4 {
		t.Fatalf("epoch %d, revision %+v", s.Epoch, r)
	}
	// Same spec, re-created object: a new uid, taken as is.
	p.Object = &config.ObjectRevision{UID: "uid-2", Generation: 1}
	if err := s.Reconcile([]config.Provider{p}); err != nil {
		t.Fatal(err)
	}
	if r := s.Revision("qwen"); r.UID != "uid-2" || r.Generation != 1 {
		t.Errorf("re-created object: revision %+v", r)
	}
}

// TestOneOperatorPerStateDir: a second OpenState of a held stateDir fails
// and names it; once the first is closed, the directory can be taken.
func TestOneOperatorPerStateDir(t *testing.T) {
	dir := t.TempDir()
	s1, err := OpenState(dir, 1, nil, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenState(dir, 2, nil, OpenOptions{}); err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "another operator") {
		t.Fatalf("a second operator on the same stateDir: %v", err)
	}
	s1.Close()
	s2, err := OpenState(dir, 3, nil, OpenOptions{})
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	s2.Close()
}

// TestEpochAheadHaltsPublication: an epoch in the state file more than ten
// minutes ahead of the clock (the host's clock was once ahead) is kept on
// disk and halts publication with a reason naming the file, the epoch and
// how far ahead it is; --reset-publisher-epoch starts from the clock.
func TestEpochAheadHaltsPublication(t *testing.T) {
	dir := t.TempDir()
	const ahead = 3_600_000 // an hour
	s, _ := OpenState(dir, 10_000_000+ahead, providers("a"), OpenOptions{})
	s.Close()
	before, _ := os.ReadFile(filepath.Join(dir, stateFile))

	s, err := OpenState(dir, 10_000_000, providers("a"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Halted == "" || !strings.Contains(s.Halted, filepath.Join(dir, stateFile)) || !strings.Contains(s.Halted, "13600000") ||
		!strings.Contains(s.Halted, "1h0m0s ahead") || !strings.Contains(s.Halted, "--reset-publisher-epoch") {
		t.Errorf("halted: %q", s.Halted)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, stateFile)); string(after) != string(before) {
		t.Error("a halted start rewrote the state file")
	}
	s.Close()
	// Within the bound: no halt.
	s, _ = OpenState(dir, 10_000_000+ahead-9*60_000, providers("a"), OpenOptions{})
	if s.Halted != "" || s.Epoch != 10_000_000+ahead+1 {
		t.Errorf("nine minutes ahead: halted %q, epoch %d", s.Halted, s.Epoch)
	}
	s.Close()
	s, _ = OpenState(dir, 10_000_000, providers("a"), OpenOptions{ResetEpoch: true})
	defer s.Close()
	if s.Halted != "" || s.Epoch != 10_000_000 {
		t.Errorf("reset: halted %q, epoch %d, want the clock", s.Halted, s.Epoch)
	}
}

// TestDeletedStateDirIsRecreated: the epoch high-water mark goes back on
// disk, and the lock with it.
func TestDeletedStateDirIsRecreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := OpenState(dir, 77, providers("a"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if again, err := s.Ensure(); again || err != nil {
		t.Fatalf("a whole stateDir: recreated %v, %v", again, err)
	}
	os.RemoveAll(dir)
	if again, err := s.Ensure(); !again || err != nil {
		t.Fatalf("a deleted stateDir: recreated %v, %v", again, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil || !strings.Contains(string(data), `"publisherEpoch": 77`) {
		t.Fatalf("state after recreation: %s (%v)", data, err)
	}
	if _, err := OpenState(dir, 78, nil, OpenOptions{}); err == nil {
		t.Error("the recreated stateDir is not locked")
	}
}
