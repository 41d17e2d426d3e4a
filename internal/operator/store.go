package operator

import (
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/signals"
)

// Store holds published rows per target (a provider's routing identity),
// each entry stamped at collection and expiring after a TTL. The site store
// holds this site's providers; the peers store (cross-site half) holds what
// peers published.
type Store struct {
	ttl time.Duration
	// changed, when set, is called after every change of the entries
	// (set once, before use).
	changed func()

	mu      sync.Mutex
	entries map[string]*Entry
}

// Entry is one target's latest batch.
type Entry struct {
	Target string
	Rows   []signals.Row
	// CollectedAt is when the rows were collected, read on the operator's
	// clock (it carries the monotonic reading: stamps survive wall steps).
	// For a peer's rows it is the local instant their age points at.
	CollectedAt time.Time
	ExpiresAt   time.Time
	// Batch is the entry's batch metadata, when it carried a valid line.
	Batch *signals.Batch
}

// NewStore returns an empty store whose entries live for ttl.
func NewStore(ttl time.Duration) *Store {
	return &Store{ttl: ttl, entries: map[string]*Entry{}}
}

// Put replaces a target's rows, collected at; they expire a TTL later.
func (s *Store) Put(target string, rows []signals.Row, at time.Time) {
	s.PutEntry(&Entry{Target: target, Rows: rows, CollectedAt: at, ExpiresAt: at.Add(s.ttl)})
}

// PutEntry stores a prepared entry.
func (s *Store) PutEntry(e *Entry) {
	s.mu.Lock()
	s.entries[e.Target] = e
	s.mu.Unlock()
	s.notify()
}

func (s *Store) notify() {
	if s.changed != nil {
		s.changed()
	}
}

// TTL is how long entries live.
func (s *Store) TTL() time.Duration { return s.ttl }

// Replace swaps every entry whose target starts with prefix for entries: a
// peer's answer replaces all that peer held.
func (s *Store) Replace(prefix string, entries []*Entry) {
	s.mu.Lock()
	for k := range s.entries {
		if strings.HasPrefix(k, prefix) {
			delete(s.entries, k)
		}
	}
	for _, e := range entries {
		s.entries[e.Target] = e
	}
	s.mu.Unlock()
	s.notify()
}

// Get returns a target's entry, expired or not, for fencing.
func (s *Store) Get(target string) *Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[target]
}

// Delete drops a target (its provider was removed).
func (s *Store) Delete(target string) {
	s.mu.Lock()
	delete(s.entries, target)
	s.mu.Unlock()
	s.notify()
}

// Current returns the unexpired entries at now in target order, dropping the
// expired ones. Entries are immutable once stored; callers may keep them.
func (s *Store) Current(now time.Time) []*Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Entry, 0, len(s.entries))
	for k, e := range s.entries {
		if !now.Before(e.ExpiresAt) {
			delete(s.entries, k)
			continue
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out
}

// StampMs is a row's timestamp at render time: the wall clock now, less
// the monotonic time elapsed since collection.
func (e *Entry) StampMs(now time.Time) int64 {
	return now.UnixMilli() - now.Sub(e.CollectedAt).Milliseconds()
}
