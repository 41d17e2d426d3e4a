package route

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/grid-inference/grid/internal/loadstore"
)

// OwnSends is a gateway's memory of its own sends: per candidate, how many
// of the requests this gateway sent since the candidate's latest reading are
// still in flight. The age-aware pick reads it to see what the board cannot
// show yet, and writes it (one compare-and-swap) for the candidate it
// picks: it is the only state the request path writes, kept apart from the
// snapshot, which nothing writes once built.
//
// The builder binds every new snapshot to it (bind, under Builder.mu): a
// candidate keeps its counter while its reading stays the same, and gets a
// fresh one when a newer reading arrived, since that reading includes the
// sends. Picks find the counters of the snapshot they hold through the
// binding, and hand them to the snapshot.
type OwnSends struct {
	// Builder.mu guards byKey: the builder's goroutine binds and forgets.
	byKey map[loadstore.Key]*sendCounter
	// bound is read by any goroutine: the latest snapshot's counters and,
	// for a pick that loaded the snapshot just before a rebuild swapped it,
	// the previous one's.
	bound atomic.Pointer[binding]
	mu    sync.Mutex // serialises bind and forget when no builder holds them
}

// binding aligns counters with one snapshot's candidates.
type binding struct {
	snap     *Snapshot
	counters []*sendCounter // nil where the candidate has no reading
	prev     *binding       // the binding before, its own prev cleared
}

// NewOwnSends returns an empty tracker.
func NewOwnSends() *OwnSends {
	return &OwnSends{byKey: map[loadstore.Key]*sendCounter{}}
}

// bind gives each candidate of snap with a reading its counter (the
// age-aware pick's, and affinity's, which may send to an existing-only
// candidate the pick does not draw) and publishes the binding. It is called
// before snap is published, so a pick that holds snap always finds it
// bound.
func (o *OwnSends) bind(snap *Snapshot) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := &binding{snap: snap, counters: make([]*sendCounter, len(snap.Candidates))}
	for i := range snap.Candidates {
		c := &snap.Candidates[i]
		if c.latestAt == 0 {
			continue
		}
		k := c.Key()
		cnt := o.byKey[k]
		if cnt == nil || cnt.readingAt != c.latestAt {
			cnt = &sendCounter{readingAt: c.latestAt}
			o.byKey[k] = cnt
		}
		b.counters[i] = cnt
	}
	if prev := o.bound.Load(); prev != nil {
		b.prev = &binding{snap: prev.snap, counters: prev.counters}
	}
	o.bound.Store(b)
}

// forget drops the counters of keys the store forgot.
func (o *OwnSends) forget(keys []loadstore.Key) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, k := range keys {
		delete(o.byKey, k)
	}
}

// countersFor returns the counters bound to snap, or nil when o is nil or
// snap is older than the last two bindings (its picks then read the board
// alone).
func (o *OwnSends) countersFor(snap *Snapshot) []*sendCounter {
	if o == nil {
		return nil
	}
	for b := o.bound.Load(); b != nil; b = b.prev {
		if b.snap == snap {
			return b.counters
		}
	}
	return nil
}

// sendCounter estimates how many of this gateway's sends to one candidate,
// made since its reading, are still in flight: each drains with the site's
// predicted backlog (decayed), so a burst just sent counts fully, and sends
// long finished count for nothing, whatever the reading's age. The estimate
// at the last send and that send's instant share one word, updated by
// compare-and-swap: the request path takes no lock.
type sendCounter struct {
	readingAt int64 // ms on the store timeline
	// state is the estimate's float32 bits above the last send's instant,
	// in ms since readingAt.
	state atomic.Uint64
}

func (o *sendCounter) unpack(w uint64) (estimate float64, atMs int64) {
	return float64(math.Float32frombits(uint32(w >> 32))), int64(uint32(w))
}

// since is nowMs relative to the reading, clamped to what the word holds.
func (o *sendCounter) since(nowMs int64) int64 {
	return min(max(nowMs-o.readingAt, 0), math.MaxUint32)
}

// decayed is what remains in flight of estimate own sends elapsedMs after
// they were counted, at a site predicted at load (in-flight over capacity):
// the sends join the site's backlog and drain with it, at the full service
// rate while a queue stands ahead of them, exponentially once slots are
// free (drain).
func decayed(estimate float64, elapsedMs int64, meanMs, load, capacity float64) float64 {
	if elapsedMs <= 0 || estimate == 0 {
		return estimate
	}
	age := float64(elapsedMs) / meanMs
	return max(capacity*(drain(load+estimate/capacity, age)-drain(load, age)), 0)
}

// inFlight is the estimate at nowMs, at a site predicted at load.
func (o *sendCounter) inFlight(nowMs int64, meanMs, load, capacity float64) float64 {
	v, at := o.unpack(o.state.Load())
	return decayed(v, o.since(nowMs)-at, meanMs, load, capacity)
}

// add records a send at nowMs.
func (o *sendCounter) add(nowMs int64, meanMs, load, capacity float64) {
	rel := o.since(nowMs)
	for {
		old := o.state.Load()
		v, at := o.unpack(old)
		next := decayed(v, rel-at, meanMs, load, capacity) + 1
		w := uint64(math.Float32bits(float32(next)))<<32 | uint64(uint32(max(rel, at)))
		if o.state.CompareAndSwap(old, w) {
			return
		}
	}
}
