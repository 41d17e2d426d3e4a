package route

import (
	"math"
	"sort"
	"sync/atomic"

	"github.com/grid-inference/grid/internal/loadstore"
)

// interpret reads every candidate's load through its age (docs/routing.md,
// after Dahlin, "Interpreting stale load information", 2000): a reading of
// age a is not the present. Each site drains from its reading as its busy
// slots complete, while the grid's arrivals flow to the least-loaded sites
// in proportion to their capacity, raising them together. The sites whose
// predicted load has reached the common level form the active set; a
// request draws among them. A fresh board makes this join-the-shortest-
// queue; an old one makes it weighted random by capacity, which is right
// when the board says nothing any more. Randomising inside the active set is
// what keeps gateways from herding.
func (b *Builder) interpret(snap *Snapshot, now int64, set Settings) {
	d := set.MeanDurationMs
	if d <= 0 {
		d = 10_000
	}
	for _, idx := range snap.byModel {
		var group []*Candidate
		for _, i := range idx {
			c := &snap.Candidates[i]
			if c.Admission != NewAndExisting || math.IsNaN(c.Score) || !c.Measured || c.latestAt == 0 {
				continue
			}
			group = append(group, c)
		}
		if len(group) == 0 {
			continue
		}
		// The grid's arrival rate, in requests per mean duration, is what its
		// busy slots complete in steady state.
		// Capacity here is the learned ceiling itself: the explore floor
		// that lifts small sites' weights in the reference draws would
		// overfill them here (measured in internal/routesim).
		var busy, meanAge, capSum float64
		for _, c := range group {
			busy += math.Min(c.Predicted, c.Ceiling)
			meanAge += float64(max(now-c.latestAt, 0)) / d * c.Ceiling
			capSum += c.Ceiling
		}
		meanAge /= capSum
		arrivals := busy * meanAge
		for _, c := range group {
			c.Predicted = drain(c.Predicted/c.Ceiling, float64(max(now-c.latestAt, 0))/d)
		}
		level := waterLevel(group, arrivals)
		for _, c := range group {
			c.Active = c.Predicted <= level+1e-9
			c.own = b.ownFor(c)
			c.level = level
		}
	}
	snap.meanMs = d
}

// drain predicts a load (in-flight over capacity) age mean durations later
// with no arrivals: a queue drains at the full service rate, then busy slots
// complete exponentially.
func drain(load, age float64) float64 {
	if load > 1 {
		if age <= load-1 {
			return load - age
		}
		age -= load - 1
		load = 1
	}
	return load * math.Exp(-age)
}

// waterLevel pours arrivals into the sites from the least loaded up, each
// absorbing its capacity per unit of level, and returns the level reached.
func waterLevel(group []*Candidate, arrivals float64) float64 {
	sorted := append([]*Candidate(nil), group...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Predicted < sorted[j].Predicted })
	var capSum, weighted float64
	level := sorted[0].Predicted
	for k, c := range sorted {
		capSum += c.Ceiling
		weighted += c.Ceiling * c.Predicted
		level = (arrivals + weighted) / capSum
		if k+1 == len(sorted) || level <= sorted[k+1].Predicted {
			break
		}
	}
	return level
}

// ownFor returns the candidate's own-sends counter, starting a new one when
// a newer reading arrived (the reading now includes those sends).
func (b *Builder) ownFor(c *Candidate) *ownSends {
	k := loadstore.Key{Site: c.Site, Provider: c.Provider}
	o := b.own[k]
	if o == nil || o.readingAt != c.latestAt {
		o = &ownSends{readingAt: c.latestAt}
		b.own[k] = o
	}
	return o
}

// pickAgeAware draws two active candidates by capacity and takes the one
// with the lower predicted load after this gateway's own sends still in
// flight. Own sends also move the active set between snapshots: once they
// lift the active sites past the next one, it joins, so a burst between two
// polls spreads as the water would. It returns -1 when no healthy candidate
// was interpreted.
func (s *Snapshot) pickAgeAware(healthy []int32, u0, u1 float64, nowMs int64) int32 {
	// Each healthy candidate's load, read once: decaying own sends costs an
	// exponential.
	var loads [MaxSites]float64
	level, minLoad := math.Inf(-1), math.Inf(1)
	for k, i := range healthy {
		if c := &s.Candidates[i]; c.own != nil {
			loads[k] = s.load(i, nowMs)
			level = c.level
			minLoad = math.Min(minLoad, loads[k])
		}
	}
	if math.IsInf(minLoad, 1) {
		return -1
	}
	level = math.Max(level, minLoad) + 1e-9
	var active [MaxSites]int32
	n := 0
	for k, i := range healthy {
		if s.Candidates[i].own != nil && loads[k] <= level {
			active[n] = i
			n++
		}
	}
	first := s.weighted(active[:n], -1, u0, ceiling)
	second := s.weighted(active[:n], first, u1, ceiling)
	pick := first
	if second >= 0 && s.load(second, nowMs) < s.load(first, nowMs) {
		pick = second
	}
	if !s.ignoreOwn {
		c := &s.Candidates[pick]
		c.own.add(nowMs, s.meanMs, c.Predicted, c.Ceiling)
	}
	return pick
}

func (s *Snapshot) load(i int32, nowMs int64) float64 {
	c := &s.Candidates[i]
	if s.ignoreOwn {
		return c.Predicted
	}
	return c.Predicted + c.own.inFlight(nowMs, s.meanMs, c.Predicted, c.Ceiling)/c.Ceiling
}

// ceiling weighs an active candidate by its learned ceiling.
func ceiling(c *Candidate) float64 { return c.Ceiling }

// ownSends estimates how many of this gateway's sends to one candidate,
// made since its reading, are still in flight: each drains with the site's
// predicted backlog (decayed), so a burst just sent counts fully, and sends
// long finished count for nothing, whatever the reading's age. The estimate
// at the last send and that send's instant share one word, updated by
// compare-and-swap: the request path takes no lock.
type ownSends struct {
	readingAt int64 // ms on the store timeline
	// state is the estimate's float32 bits above the last send's instant,
	// in ms since readingAt.
	state atomic.Uint64
}

func (o *ownSends) unpack(w uint64) (estimate float64, atMs int64) {
	return float64(math.Float32frombits(uint32(w >> 32))), int64(uint32(w))
}

// since is nowMs relative to the reading, clamped to what the word holds.
func (o *ownSends) since(nowMs int64) int64 {
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
func (o *ownSends) inFlight(nowMs int64, meanMs, load, capacity float64) float64 {
	v, at := o.unpack(o.state.Load())
	return decayed(v, o.since(nowMs)-at, meanMs, load, capacity)
}

// add records a send at nowMs.
func (o *ownSends) add(nowMs int64, meanMs, load, capacity float64) {
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
