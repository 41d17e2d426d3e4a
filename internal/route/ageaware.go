package route

import (
	"math"
	"sort"
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
			c.interpreted = true
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

// pickAgeAware draws two active candidates by capacity and takes the one
// with the lower predicted load after this gateway's own sends still in
// flight (counters, aligned with s.Candidates; nil reads the board alone).
// Own sends also move the active set between snapshots: once they lift the
// active sites past the next one, it joins, so a burst between two polls
// spreads as the water would. The pick is counted in its counter, the one
// write of the request path. It returns -1 when no healthy candidate was
// interpreted.
func (s *Snapshot) pickAgeAware(healthy []int32, u0, u1 float64, nowMs int64, counters []*sendCounter) int32 {
	// Each healthy candidate's load, read once: decaying own sends costs an
	// exponential.
	var loads [MaxSites]float64
	level, minLoad := math.Inf(-1), math.Inf(1)
	for k, i := range healthy {
		if c := &s.Candidates[i]; c.interpreted {
			loads[k] = s.load(i, nowMs, counters)
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
		if s.Candidates[i].interpreted && loads[k] <= level {
			active[n] = i
			n++
		}
	}
	first := s.weighted(active[:n], -1, u0, ceiling)
	second := s.weighted(active[:n], first, u1, ceiling)
	pick := first
	if second >= 0 && s.load(second, nowMs, counters) < s.load(first, nowMs, counters) {
		pick = second
	}
	if counters != nil {
		c := &s.Candidates[pick]
		counters[pick].add(nowMs, s.meanMs, c.Predicted, c.Ceiling)
	}
	return pick
}

// load is candidate i's predicted load with this gateway's own sends.
func (s *Snapshot) load(i int32, nowMs int64, counters []*sendCounter) float64 {
	c := &s.Candidates[i]
	if counters == nil {
		return c.Predicted
	}
	return c.Predicted + counters[i].inFlight(nowMs, s.meanMs, c.Predicted, c.Ceiling)/c.Ceiling
}

// ceiling weighs an active candidate by its learned ceiling.
func ceiling(c *Candidate) float64 { return c.Ceiling }
