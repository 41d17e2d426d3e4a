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

// add records a send at nowMs of weight mean requests (1 for a request
// of unknown size; CostModel.Weight).
func (o *sendCounter) add(nowMs int64, meanMs, load, capacity, weight float64) {
	rel := o.since(nowMs)
	for {
		old := o.state.Load()
		v, at := o.unpack(old)
		next := decayed(v, rel-at, meanMs, load, capacity) + weight
		w := uint64(math.Float32bits(float32(next)))<<32 | uint64(uint32(max(rel, at)))
		if o.state.CompareAndSwap(old, w) {
			return
		}
	}
}
