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
	s1, err := OpenState(dir, 5000, providers("a"))
	if err != nil {
		t.Fatal(err)
	}
	if s1.Epoch != 5000 {
		t.Fatalf("first epoch %d, want the wall clock", s1.Epoch)
	}
	// The clock stepped back an hour: the epoch still rises.
	s2, err := OpenState(dir, 5000-3_600_000, providers("a"))
	if err != nil {
		t.Fatal(err)
	}
	if s2.Epoch != 5001 {
		t.Fatalf("epoch after a clock step back %d, want 5001", s2.Epoch)
	}
	// The clock moved on: it wins.
	s3, _ := OpenState(dir, 9000, providers("a"))
	if s3.Epoch != 9000 {
		t.Fatalf("epoch %d, want 9000", s3.Epoch)
	}
	if s1.Revision("a").UID != s3.Revision("a").UID {
		t.Error("uid changed across restarts")
	}
}

func TestRevisions(t *testing.T) {
	dir := t.TempDir()
	s, _ := OpenState(dir, 1, providers("a", "b"))
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

func TestCorruptStateRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, stateFile), []byte("{not json"), 0o600)
	_, err := OpenState(dir, 1, nil)
	if err == nil || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "delete it") {
		t.Fatalf("error %v", err)
	}
}

func TestStateWrittenBeforeUse(t *testing.T) {
	dir := t.TempDir()
	s, _ := OpenState(dir, 42, providers("a"))
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
