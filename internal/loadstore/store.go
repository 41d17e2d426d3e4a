// Package loadstore is the gateway's store of load readings: per site and
// provider, per metric, a short window of samples on the gateway's own
// timeline. Poll and route meet here and only here: the poller ingests, the
// snapshot builder reads (docs/protocol.md §4.8).
package loadstore

import (
	"sort"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/signals"
)

// Store caps (docs/protocol.md §3.3).
const (
	MaxKeys            = 4096
	MaxKeysPerSite     = 256
	MaxMetricsPerKey   = 64
	MaxSamplesPerSerie = 128
	// OriginToleranceMs is how close two stamps must be to be one
	// publication folded together.
	OriginToleranceMs = 1
)

// Timeline is the gateway's clock: the wall clock read once at start,
// advanced by the monotonic clock only, so a step of the wall clock neither
// drops new rows nor ages held ones.
type Timeline struct {
	clk   clock.Clock
	start time.Duration // the monotonic reading at start
	wall  int64         // the wall clock at start, ms
}

// NewTimeline starts a timeline now.
func NewTimeline(clk clock.Clock) *Timeline {
	return &Timeline{clk: clk, start: clk.Monotonic(), wall: clk.Now().UnixMilli()}
}

// NowMs is the timeline's current reading in milliseconds.
func (t *Timeline) NowMs() int64 { return t.wall + (t.clk.Monotonic() - t.start).Milliseconds() }

// Sample is one reading on the timeline.
type Sample struct {
	At    int64
	Value float64
}

type series struct {
	samples      []Sample
	newestOrigin int64
	folded       []uint64 // label hashes folded into the newest sample
	sum          bool     // combine same-instant rows by sum (else max)
}

// push adds a sample: rows of one publication (same origin within 1 ms, or
// the same instant) fold into one sample, by Sum for the flow-control queue
// and Max otherwise; an older sample is dropped; the window and the sample
// cap evict from the front.
func (s *series) push(at int64, v float64, labels uint64, origin int64, windowMs int64) {
	if n := len(s.samples); n > 0 {
		newest := &s.samples[n-1]
		if abs(origin-s.newestOrigin) <= OriginToleranceMs || at == newest.At {
			for _, h := range s.folded {
				if h == labels {
					return
				}
			}
			s.folded = append(s.folded, labels)
			if s.sum {
				newest.Value += v
			} else {
				newest.Value = max(newest.Value, v)
			}
			return
		}
		if at < newest.At {
			return
		}
	}
	s.samples = append(s.samples, Sample{at, v})
	s.folded = append(s.folded[:0], labels)
	s.newestOrigin = origin
	drop := 0
	for drop < len(s.samples)-1 && s.samples[drop].At < at-windowMs {
		drop++
	}
	if over := len(s.samples) - drop - MaxSamplesPerSerie; over > 0 {
		drop += over
	}
	if drop > 0 {
		s.samples = append(s.samples[:0], s.samples[drop:]...)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// Key identifies one provider of one site.
type Key struct{ Site, Provider string }

func (k Key) String() string { return k.Site + "/" + k.Provider }

// entry is what the store holds for one key.
type entry struct {
	series map[string]*series
	// fence is the newest batch admitted for the key.
	fence signals.Fence
	// learnable is false while the key's latest batch metadata is missing,
	// incomplete or empty: pressure signals stay usable, learning stops.
	learnable bool
	// identity changes (uid, generation, epoch) bump this, so learned
	// capacity is reset.
	generation int
	// identityAt is the timeline instant of the current identity's first
	// batch (math.MinInt64 for the first identity seen); samples before it
	// came from an earlier identity.
	identityAt int64
	// model is what grid_provider_info says the provider serves, and
	// admission which requests it takes.
	model     string
	admission signals.Admission
	// infoAt is the timeline instant of the latest info row.
	infoAt int64
	// newestAt is the timeline instant of the newest row stored.
	newestAt int64
}

// Store is the load store. It is safe for concurrent use.
type Store struct {
	windowMs int64

	mu      sync.RWMutex
	keys    map[Key]*entry
	perSite map[string]int
}

// New returns a store that keeps window of samples per series.
func New(window time.Duration) *Store {
	return &Store{windowMs: window.Milliseconds(), keys: map[Key]*entry{}, perSite: map[string]int{}}
}

// Keys lists the keys held, sorted.
func (s *Store) Keys() []Key {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Key, 0, len(s.keys))
	for k := range s.keys {
		out = append(out, k)
	}
	sortKeys(out)
	return out
}

func sortKeys(keys []Key) {
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Site != keys[j].Site {
			return keys[i].Site < keys[j].Site
		}
		return keys[i].Provider < keys[j].Provider
	})
}

// Forget drops every key whose newest row is older than cutoffMs on the
// timeline (its series, fence and model, and its place under the caps), so
// a provider that stopped being relayed leaves the candidate list. It
// returns the keys dropped, sorted.
func (s *Store) Forget(cutoffMs int64) []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []Key
	for k, e := range s.keys {
		if e.newestAt < cutoffMs {
			delete(s.keys, k)
			if s.perSite[k.Site]--; s.perSite[k.Site] == 0 {
				delete(s.perSite, k.Site)
			}
			gone = append(gone, k)
		}
	}
	sortKeys(gone)
	return gone
}

// View is a read of one key, copied out of the store so a snapshot builder
// can compute without holding the lock.
type View struct {
	Key        Key
	Series     map[string][]Sample
	Learnable  bool
	Generation int
	// IdentitySince is the timeline instant from which the samples are the
	// current provider identity's (math.MinInt64: all of them): what an earlier
	// identity (another uid, config generation or publisher epoch) reported
	// must not teach capacity.
	IdentitySince int64
	Model         string
	// Admission is what the latest info row says the provider takes.
	Admission signals.Admission
}

// View returns a copy of a key's series, or false.
func (s *Store) View(k Key) (View, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.keys[k]
	if !ok {
		return View{}, false
	}
	v := View{Key: k, Series: make(map[string][]Sample, len(e.series)), Learnable: e.learnable, Generation: e.generation, IdentitySince: e.identityAt, Model: e.model, Admission: e.admission}
	for name, ser := range e.series {
		v.Series[name] = append([]Sample(nil), ser.samples...)
	}
	return v, true
}
