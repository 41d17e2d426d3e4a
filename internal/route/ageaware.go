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
// as its busy slots complete (boardAt), while the grid's arrivals since the
// readings flow to the least-loaded sites in proportion to their capacity,
// raising them together. The sites whose predicted load has reached the
// level form the active set. On a fresh board the flow goes to the least
// loaded; on an old one by capacity, which is right when the board says
// nothing any more. order is scratch of group's length. It allocates
// nothing, so the request path can call it.
func (s *Snapshot) predict(group []int32, nowMs int64, loads []float64, order []int32) float64 {
	// The grid's arrival rate (per ms) is what its busy slots complete in
	// steady state, each site's at its own pace. Capacity here is the
	// learned ceiling itself: the explore floor that lifts small sites'
	// weights in the reference draws would overfill them here (measured in
	// internal/routesim).
	var rate, meanAgeMs, capSum float64
	for k, i := range group {
		c := &s.Candidates[i]
		rate += math.Min(c.readLoad, 1) * c.Ceiling / c.unitMs
		meanAgeMs += float64(max(nowMs-c.latestAt, 0)) * c.Ceiling
		capSum += c.Ceiling
		loads[k] = c.boardAt(nowMs)
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

// boardAt is the candidate's load (in-flight over its ceiling) at nowMs
// by its latest reading alone: drained through the reading's age in the
// site's own unit. A backlog seen to persist across readings is held as
// long again before it drains: a site whose requests are longer than the
// unit says (a batch of long completions sent to it directly) drains far
// slower, and its persistence is the evidence (docs/routing.md).
func (c *Candidate) boardAt(nowMs int64) float64 {
	return drain(c.readLoad, float64(max(nowMs-c.latestAt-c.backlogMs, 0))/c.unitMs)
}

// ownInFlight is the load this gateway's own sends to candidate i, still in
// flight at nowMs, add to its board; 0 without counters.
func ownInFlight(counters []*sendCounter, i int32, c *Candidate, nowMs int64, board float64) float64 {
	if counters == nil || counters[i] == nil {
		return 0
	}
	return counters[i].inFlight(nowMs, c.unitMs, board, c.Ceiling) / c.Ceiling
}

// countSend records a send to candidate i as one of this gateway's own,
// the one write of the request path; nothing without counters.
func countSend(counters []*sendCounter, i int32, c *Candidate, nowMs int64, board float64) {
	if counters != nil && counters[i] != nil {
		counters[i].add(nowMs, c.unitMs, board, c.Ceiling)
	}
}

// hasRoom reports whether a candidate read at load (with this gateway's
// own sends) has a free slot for one more request (Pick.Room).
func hasRoom(c *Candidate, load float64) bool { return load*c.Ceiling+1 <= c.Ceiling+1e-9 }

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
		loads[k] = board[k] + ownInFlight(counters, i, &s.Candidates[i], nowMs, board[k])
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
	countSend(counters, i, c, nowMs, board[at[pick]])
	return i, hasRoom(c, loads[at[pick]])
}

// serviceRate weighs an active candidate by the requests it completes per
// ms when full: its learned ceiling over its site's mean duration. A site
// whose requests take four times longer takes a quarter of the share per
// slot (grid bench routing --scenario slow-site).
func serviceRate(c *Candidate) float64 { return c.Ceiling / c.unitMs }
