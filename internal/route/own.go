package route

import (
	"math"
	"sync/atomic"
)

// sendCounter is the age-aware policy's memory of this gateway's own sends
// to one candidate since its reading: the picks read it to see what the
// board cannot show yet, and write it for the candidate they pick. It
// estimates how many of this gateway's sends to one candidate,
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
	// recent holds the latest sendRing sends one by one, each packed as
	// state is (its weight, its instant), for the counter of the next
	// reading (carry); next counts the sends, and places the next one.
	recent [sendRing]atomic.Uint64
	next   atomic.Uint32
}

// sendRing is how many of its latest sends a counter keeps one by one: a
// reading arrives a poll's age after its instant, and the sends made in
// between, which it cannot count, are carried to its counter (carry). A
// gateway that sends more than this in a reading's age holds enough
// requests for its own count to decide its picks (ownInformed), not this
// estimate.
const sendRing = 32

func pack(estimate float64, atMs int64) uint64 {
	return uint64(math.Float32bits(float32(estimate)))<<32 | uint64(uint32(atMs))
}

func (o *sendCounter) unpack(w uint64) (estimate float64, atMs int64) {
	return float64(math.Float32frombits(uint32(w >> 32))), int64(uint32(w))
}

// carry returns the counter for a newer reading taken at readingAt (ms on
// the store timeline): it starts with the sends o saw after that instant,
// which the reading cannot count, as one estimate at the latest of them,
// and keeps them one by one for the reading after (which may have been
// taken before some of them); those before the instant are in the
// reading. A nil o carries nothing. The snapshot's builder only; a send
// that races it is left to o.
func (o *sendCounter) carry(readingAt int64) *sendCounter {
	n := &sendCounter{readingAt: readingAt}
	if o == nil {
		return n
	}
	sum, last, kept := 0.0, int64(0), uint32(0)
	for i := range min(int(o.next.Load()), sendRing) {
		w := o.recent[i].Load()
		weight, rel := o.unpack(w)
		if at := o.readingAt + rel - readingAt; at > 0 {
			sum += weight
			last = max(last, at)
			n.recent[kept].Store(pack(weight, at))
			kept++
		}
	}
	n.next.Store(kept)
	if sum > 0 {
		n.state.Store(pack(sum, last))
	}
	return n
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

// add records a send at nowMs of weight mean requests (1 for a request
// of unknown size; CostModel.Weight).
func (o *sendCounter) add(nowMs int64, meanMs, load, capacity, weight float64) {
	rel := o.since(nowMs)
	for {
		old := o.state.Load()
		v, at := o.unpack(old)
		next := decayed(v, rel-at, meanMs, load, capacity) + weight
		if o.state.CompareAndSwap(old, pack(next, max(rel, at))) {
			break
		}
	}
	o.recent[(o.next.Add(1)-1)%sendRing].Store(pack(weight, rel))
}
