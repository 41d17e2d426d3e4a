package operator

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/signals"
	"go.yaml.in/yaml/v3"
)

// Files in stateDir: the operator's durable state, and the lock that makes
// this process its one writer.
const (
	stateFile = "operator-state.json"
	lockFile  = "operator.lock"
)

// OpenOptions are the rarely used choices of OpenState.
type OpenOptions struct {
	// ResetEpoch discards a stored publisher epoch that is more than
	// signals.EpochAheadMs ahead of the clock, and starts from the clock
	// (docs/reliability.md, "publisher epoch ahead of the clock").
	ResetEpoch bool
}

// State is what an operator keeps across restarts so that receivers can
// order its batches (docs/protocol.md §2.3, §4.9): the publisher-epoch high-water
// mark, and each provider's uid and config generation.
type State struct {
	path string
	// lock holds the exclusive lock on stateDir while the state is open.
	lock *os.File
	// Halted is why this process must not publish, or "": its stored
	// epoch is further ahead of the clock than receivers admit, so
	// everything it published would be refused.
	Halted string `json:"-"`
	// Epoch is this process's publisher epoch: above every epoch published
	// before, and at least the wall clock in milliseconds at start.
	Epoch int64 `json:"publisherEpoch"`
	// mu guards Providers and the revisions it holds: a reload
	// (Reconcile, on the reload goroutine) writes them while scrapes read
	// them (Revision, on the scrape goroutines). The other fields are set
	// at open and by Ensure, on the maintenance goroutine.
	mu sync.RWMutex
	// Providers maps provider names to their revision.
	Providers map[string]*Revision `json:"providers"`
}

// Revision identifies one provider's configuration.
type Revision struct {
	// UID is minted once per provider name; a provider removed and added
	// again gets a new one.
	UID string `json:"uid"`
	// Generation advances when the provider's config block changes.
	Generation int64 `json:"generation"`
	// ConfigHash is the digest of the config block the generation belongs to.
	ConfigHash string `json:"configHash"`
}

// OpenState takes stateDir (an exclusive lock: one operator per stateDir),
// loads its state, takes a new epoch above the last one (and at least
// nowMs), reconciles the providers, and writes it all durably before
// returning: nothing is published under an epoch that is not on disk. A
// state file that cannot be read or parsed is an error, not a fresh start:
// starting over could publish an epoch below one already published. A
// stored epoch more than signals.EpochAheadMs ahead of nowMs (the host's
// clock was once ahead) halts publication (State.Halted) unless
// opts.ResetEpoch. Close releases the lock.
func OpenState(dir string, nowMs int64, providers []config.Provider, opts OpenOptions) (*State, error) {
	s := &State{path: filepath.Join(dir, stateFile), Providers: map[string]*Revision{}}
	if err := s.takeDir(); err != nil {
		return nil, err
	}
	if err := s.load(nowMs, providers, opts); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// load reads the state file and takes this process's epoch.
func (s *State) load(nowMs int64, providers []config.Provider, opts OpenOptions) error {
	data, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read operator state: %w", err)
	default:
		if err := json.Unmarshal(data, s); err != nil {
			return fmt.Errorf("operator state %s is corrupt (%v); it holds the publisher epoch high-water mark, "+
				"so the operator will not guess one: restore it, or delete it to start a new epoch from the wall clock", s.path, err)
		}
		if s.Providers == nil {
			s.Providers = map[string]*Revision{}
		}
	}
	switch ahead := s.Epoch - nowMs; {
	case ahead > signals.EpochAheadMs && opts.ResetEpoch:
		s.Epoch = nowMs
	case ahead > signals.EpochAheadMs:
		// Receivers refuse an epoch this far ahead of their clocks: keep
		// the mark as it is (a clock that is now behind may be the wrong
		// one) and publish nothing.
		s.Halted = fmt.Sprintf("the publisher epoch in %s is %d, %v ahead of this host's clock; peers and gateways refuse epochs more than %v ahead, "+
			"so nothing is published. If this host's clock is right, start the operator once with --reset-publisher-epoch (docs/reliability.md)",
			s.path, s.Epoch, (time.Duration(ahead) * time.Millisecond).Round(time.Second), time.Duration(signals.EpochAheadMs)*time.Millisecond)
		return nil
	default:
		s.Epoch = max(nowMs, s.Epoch+1)
	}
	return s.reconcile(providers)
}

// takeDir creates stateDir if needed and takes its lock, without waiting:
// a second operator on the same stateDir would publish under the same
// epochs, which receivers would drop as delayed or mistake for republishes.
func (s *State) takeDir() error {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("state dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("stateDir %s is in use by another operator (its lock %s is held): one operator per stateDir", dir, lockFile)
		}
		return fmt.Errorf("lock stateDir %s: %w", dir, err)
	}
	if s.lock != nil {
		s.lock.Close()
	}
	s.lock = f
	return nil
}

// Close releases stateDir's lock.
func (s *State) Close() {
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
}

// Ensure recreates stateDir, with its lock and the state, when it was
// deleted while the operator runs: the epoch high-water mark must stay on
// disk. It reports whether it recreated anything.
func (s *State) Ensure() (recreated bool, err error) {
	if s.path == "" {
		return false, nil
	}
	if _, err := os.Stat(s.path); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("operator state: %w", err)
	}
	if err := s.takeDir(); err != nil {
		return false, err
	}
	if s.Halted != "" {
		return true, nil // nothing published, nothing to keep
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return true, s.write()
}

// NewObjectState is the state of an operator whose epoch high-water mark
// and provider revisions live elsewhere (Kubernetes mode: a ConfigMap and
// the providers' objects, internal/kube): epoch is the one reserved there,
// and nothing is written to disk.
func NewObjectState(epoch int64, providers []config.Provider) (*State, error) {
	s := &State{Epoch: epoch, Providers: map[string]*Revision{}}
	return s, s.reconcile(providers)
}

// Reconcile records a new provider set (a configuration reload): new names
// get a uid, changed blocks a new generation, removed names are forgotten.
// The result is written durably.
func (s *State) Reconcile(providers []config.Provider) error { return s.reconcile(providers) }

func (s *State) reconcile(providers []config.Provider) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := map[string]bool{}
	for i := range providers {
		p := &providers[i]
		keep[p.Name] = true
		hash, err := configHash(p)
		if err != nil {
			return err
		}
		rev, ok := s.Providers[p.Name]
		switch {
		case p.Object != nil:
			// The object's revision is authoritative: a re-created object
			// has a new uid, a spec change a new generation.
			s.Providers[p.Name] = &Revision{UID: p.Object.UID, Generation: p.Object.Generation, ConfigHash: hash}
		case !ok:
			uid, err := newUID()
			if err != nil {
				return err
			}
			s.Providers[p.Name] = &Revision{UID: uid, Generation: 1, ConfigHash: hash}
		case rev.ConfigHash != hash:
			rev.Generation++
			rev.ConfigHash = hash
		}
	}
	for name := range s.Providers {
		if !keep[name] {
			delete(s.Providers, name)
		}
	}
	return s.write()
}

// write saves the state durably; an object state has nothing to save. The
// caller holds s.mu (either way), or is the only goroutine yet.
func (s *State) write() error {
	if s.path == "" {
		return nil
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeDurably(s.path, data)
}

// writeDurably replaces path with data: a temporary file, fsync, rename over
// the old one, fsync of the directory.
func writeDurably(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write operator state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write operator state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync operator state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace operator state: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Revision returns a copy of a provider's revision, or nil when it has
// none: a copy, because a reload may advance the generation while the
// caller publishes with it.
func (s *State) Revision(name string) *Revision {
	s.mu.RLock()
	defer s.mu.RUnlock()
	rev := s.Providers[name]
	if rev == nil {
		return nil
	}
	c := *rev
	return &c
}

// configHash digests a provider's config block in a stable encoding.
func configHash(p *config.Provider) (string, error) {
	b, err := yaml.Marshal(p)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

func newUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// names returns the provider names in order, for tests and logs.
func (s *State) names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.Providers))
	for n := range s.Providers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
