package route

import "math"

// interpret marks the candidates the age-aware policy reads (docs/routing.md,
// after Dahlin, "Interpreting stale load information", 2000): each
// candidate's load at its reading (in-flight over its ceiling) and the
// reading's instant. The pick reads them through their age at its own
// instant (predict), not at the build's: a snapshot lives a poll interval,
// which for short requests (embeddings) is many request durations, and a
// load read once at build time would stand all that while. Predicted, Active
// and the level are kept as of the build for the view and the metrics.
func (b *Builder) interpret(snap *Snapshot, now int64, set Settings) {
	d := set.MeanDurationMs
	if d <= 0 {
		d = 10_000
	}
	snap.meanMs = d
	for i := range snap.Candidates {
		c := &snap.Candidates[i]
		c.unitMs = d
		if v := set.SiteMeanMs[c.Site]; v > 0 {
			c.unitMs = v
		}
	}
	for _, idx := range snap.byModel {
		group := make([]int32, 0, len(idx))
		for _, i := range idx {
			c := &snap.Candidates[i]
			if c.Admission != NewAndExisting || math.IsNaN(c.Score) || !c.Measured || c.latestAt == 0 {
				continue
			}
			c.interpreted = true
			group = append(group, i)
		}
		if len(group) == 0 {
			continue
		}
		loads := make([]float64, len(group))
		level := snap.predict(group, now, loads, make([]int32, len(group)))
		for k, i := range group {
			c := &snap.Candidates[i]
			c.Predicted = loads[k]
			c.Active = loads[k] <= level+1e-9
		}
	}
}

// predict reads each candidate of group (interpreted, one model's) through
// its age at nowMs, writing its predicted load into loads (aligned with
// group), and returns the common level: each site drains from its reading
// as its busy slots complete, while the grid's arrivals since the readings
// flow to the least-loaded sites in proportion to their capacity, raising
// them together. The sites whose predicted load has reached the level form
// the active set. On a fresh board the flow goes to the least loaded; on an
// old one by capacity, which is right when the board says nothing any more. order is scratch of group's length. It allocates
// nothing, so the request path can call it.
func (s *Snapshot) predict(group []int32, nowMs int64, loads []float64, order []int32) float64 {
	// The grid's arrival rate, in requests per mean duration, is what its
	// busy slots complete in steady state. Capacity here is the learned
	// ceiling itself: the explore floor that lifts small sites' weights in
	// the reference draws would overfill them here (measured in
	// internal/routesim).
	// rate is the grid's arrivals per ms: each site's busy slots complete
	// at its own pace.
	var rate, meanAgeMs, capSum float64
	for k, i := range group {
		c := &s.Candidates[i]
		ageMs := max(nowMs-c.latestAt, 0)
		rate += math.Min(c.readLoad, 1) * c.Ceiling / c.unitMs
		meanAgeMs += float64(ageMs) * c.Ceiling
		capSum += c.Ceiling
		// A backlog seen to persist across readings is held as long again
		// before it drains: the unit is this gateway's mean duration, and
		// a site whose own requests are longer (a batch of long
		// completions sent to it directly) drains far slower. Its
		// persistence is the evidence (docs/routing.md).
		loads[k] = drain(c.readLoad, float64(max(ageMs-c.backlogMs, 0))/c.unitMs)
		order[k] = int32(k)
	}
	arrivals := rate * meanAgeMs / capSum
	// Pour the arrivals into the sites from the least loaded up, each
	// absorbing its capacity per unit of level. Groups are small: an
	// insertion sort allocates nothing.
	for j := 1; j < len(order); j++ {
		for m := j; m > 0 && loads[order[m]] < loads[order[m-1]]; m-- {
			order[m], order[m-1] = order[m-1], order[m]
		}
	}
	var filled, weighted float64
	level := loads[order[0]]
	for j, k := range order {
		c := &s.Candidates[group[k]]
		filled += c.Ceiling
		weighted += c.Ceiling * loads[k]
		level = (arrivals + weighted) / filled
		if j+1 == len(order) || level <= loads[order[j+1]] {
			break
		}
	}
	return level
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

// pickAgeAware predicts the healthy candidates' loads at nowMs (predict),
// adds this gateway's own sends still in flight (counters, aligned with
// s.Candidates; nil reads the board alone), and draws among the candidates
// below the common level in proportion to the flow each would take to
// reach it: its service rate (serviceRate) times its distance below the
// level. u is the draw.
//
// The draw is by share, not "the least loaded of two": gateway replicas
// that read one board make one prediction, and a rule that sends each
// request to the least loaded sends every replica's requests to the same
// site, while each sees only its own sends (measured in internal/routesim,
// phases sync). Drawn by share, K replicas together pour the flow as the
// water model says. When no candidate is below the level (all at it), the
// draw is by service rate. The pick is counted in its counter, the one write of
// the request path. It returns -1 when no healthy candidate was
// interpreted, and whether the pick saw a free slot.
func (s *Snapshot) pickAgeAware(healthy []int32, u float64, nowMs int64, counters []*sendCounter) (int32, bool) {
	var group, order, active [MaxSites]int32
	n := 0
	for _, i := range healthy {
		if s.Candidates[i].interpreted {
			group[n] = i
			n++
		}
	}
	if n == 0 {
		return -1, false
	}
	var board, loads [MaxSites]float64
	level := s.predict(group[:n], nowMs, board[:n], order[:n])
	minLoad := math.Inf(1)
	for k, i := range group[:n] {
		loads[k] = board[k]
		if counters != nil {
			c := &s.Candidates[i]
			loads[k] += counters[i].inFlight(nowMs, c.unitMs, board[k], c.Ceiling) / c.Ceiling
		}
		minLoad = math.Min(minLoad, loads[k])
	}
	level = math.Max(level, minLoad)
	// active holds the candidates drawn from; at, their positions in
	// group; share, the water each takes to reach the level.
	var at [MaxSites]int
	var share [MaxSites]float64
	na, total := 0, 0.0
	for k, i := range group[:n] {
		if loads[k] <= level+1e-9 {
			active[na], at[na] = i, k
			share[na] = serviceRate(&s.Candidates[i]) * (level - loads[k])
			total += share[na]
			na++
		}
	}
	pick := 0
	if total > 1e-9 {
		target := u * total
		for pick < na-1 {
			if target -= share[pick]; target < 0 {
				break
			}
			pick++
		}
	} else {
		pick = s.weighted(active[:na], -1, u, serviceRate)
	}
	i := active[pick]
	c := &s.Candidates[i]
	if counters != nil {
		counters[i].add(nowMs, c.unitMs, board[at[pick]], c.Ceiling)
	}
	return i, (loads[at[pick]]*c.Ceiling)+1 <= c.Ceiling+1e-9
}

// serviceRate weighs an active candidate by the requests it completes per
// ms when full: its learned ceiling over its site's mean duration. A site
// whose requests take four times longer takes a quarter of the share per
// slot (grid bench routing --scenario slow-site).
func serviceRate(c *Candidate) float64 { return c.Ceiling / c.unitMs }
