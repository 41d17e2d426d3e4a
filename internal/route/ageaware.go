package route

import (
	"math"

	"github.com/grid-inference/grid/internal/loadstore"
)

// AgeAware is the default policy (docs/routing.md, after Dahlin,
// "Interpreting stale load information", 2000): it reads every healthy
// site's load through the age of its reading, in the site's own unit of
// service time, adds this gateway's own sends the board cannot show yet,
// and draws among the sites below the common level the grid's arrivals
// would fill them to. It falls back to the reference arms for a model none
// of whose healthy candidates has a reading.
//
// Its state across snapshots is the own-send counters, one per provider and
// reading, touched by the builder under Builder.mu (prepare, forget); each
// snapshot's picker holds the counters of its candidates, which picks
// update with one compare-and-swap.
type AgeAware struct {
	pace Pace
	opts AgeAwareOptions
	// counters is each provider's own-send counter for its latest
	// reading; Builder.mu.
	counters map[loadstore.Key]*sendCounter
}

// AgeAwareOptions tune the age-aware policy.
type AgeAwareOptions struct {
	// IgnoreOwnSends reads the board alone (an ablation of the routing
	// harness: internal/routesim's age-aware-no-own).
	IgnoreOwnSends bool
}

// NewAgeAware returns the age-aware policy, reading ages in pace's units.
func NewAgeAware(pace Pace, opts AgeAwareOptions) *AgeAware {
	return &AgeAware{pace: pace, opts: opts, counters: map[loadstore.Key]*sendCounter{}}
}

// Name is "age-aware".
func (*AgeAware) Name() string { return PolicyAgeAware }

func (p *AgeAware) forget(keys []loadstore.Key) {
	for _, k := range keys {
		delete(p.counters, k)
	}
}

// ageAwarePicker is one snapshot's reading by the age-aware policy; cands
// is aligned with the snapshot's candidates.
type ageAwarePicker struct {
	cands []ageCandidate
}

// ageCandidate is what the age-aware policy reads of one candidate.
type ageCandidate struct {
	// read: the candidate has a reading (Candidate.latestAt); interpreted:
	// it is also admitted for new requests, healthy and measured, so the
	// draw reads it.
	read, interpreted bool
	// readLoad is the load (in-flight over ceiling) at the latest reading.
	readLoad float64
	// unitMs is the candidate's mean request duration: its site's own
	// when the gateway can tell it apart (Pace.SiteMs), else all requests'.
	unitMs float64
	// own counts this gateway's sends since the reading; nil without a
	// reading, or when own sends are ignored.
	own *sendCounter
}

// prepare interprets the snapshot (docs/routing.md): each candidate's load
// at its reading and its unit. The picks read them through their age at
// their own instant (predict), not at the build's: a snapshot lives a poll
// interval, which for short requests (embeddings) is many request
// durations, and a load read once at build time would stand all that
// while. Predicted and Active are set as of the build for the view.
//
// A candidate keeps its own-send counter while its reading stays the same,
// and gets a fresh one when a newer reading arrived, since that reading
// includes the sends.
func (p *AgeAware) prepare(snap *Snapshot, now int64) picker {
	d := p.pace.MeanMs()
	if d <= 0 {
		d = DefaultServiceMs
	}
	pk := &ageAwarePicker{cands: make([]ageCandidate, len(snap.Candidates))}
	// A site's unit is asked of the pace once per build, not once per
	// provider: SitePace reads both estimates' windows under their locks.
	units := map[string]float64{}
	for i := range snap.Candidates {
		c, a := &snap.Candidates[i], &pk.cands[i]
		unit, ok := units[c.Site]
		if !ok {
			unit = d
			if v, ok := p.pace.SiteMs(c.Site); ok && v > 0 {
				unit = v
			}
			units[c.Site] = unit
		}
		a.unitMs = unit
		if c.latestAt == 0 {
			continue
		}
		a.read = true
		a.readLoad = c.latestInFlight / c.Ceiling
		a.interpreted = c.Admission == NewAndExisting && !math.IsNaN(c.Score) && c.Measured
		if p.opts.IgnoreOwnSends {
			continue
		}
		k := c.Key()
		cnt := p.counters[k]
		if cnt == nil || cnt.readingAt != c.latestAt {
			cnt = &sendCounter{readingAt: c.latestAt}
			p.counters[k] = cnt
		}
		a.own = cnt
	}
	for _, m := range snap.byModel {
		group := make([]int32, 0, len(m.all))
		for _, i := range m.all {
			if pk.cands[i].interpreted {
				group = append(group, i)
			}
		}
		if len(group) == 0 {
			continue
		}
		loads := make([]float64, len(group))
		level := pk.predict(snap, group, now, loads, make([]int32, len(group)))
		for k, i := range group {
			c := &snap.Candidates[i]
			c.Predicted = loads[k]
			c.Active = loads[k] <= level+levelSlack
		}
	}
	return pk
}

// levelSlack is the rounding the active set forgives: a load within it of
// the level is at the level.
const levelSlack = 1e-9

func (pk *ageAwarePicker) restrict(kept []int32) picker {
	r := &ageAwarePicker{cands: make([]ageCandidate, len(kept))}
	for k, i := range kept {
		r.cands[k] = pk.cands[i]
	}
	return r
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
func (pk *ageAwarePicker) predict(s *Snapshot, group []int32, nowMs int64, loads []float64, order []int32) float64 {
	// The grid's arrival rate (per ms) is what its busy slots complete in
	// steady state, each site's at its own pace. Capacity here is the
	// learned ceiling itself: the explore floor that lifts small sites'
	// weights in the reference draws would overfill them here (measured in
	// internal/routesim).
	var rate, meanAgeMs, capSum float64
	for k, i := range group {
		c, a := &s.Candidates[i], &pk.cands[i]
		rate += math.Min(a.readLoad, 1) * c.Ceiling / a.unitMs
		meanAgeMs += float64(max(nowMs-c.latestAt, 0)) * c.Ceiling
		capSum += c.Ceiling
		loads[k] = a.boardAt(c, nowMs)
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
func (a *ageCandidate) boardAt(c *Candidate, nowMs int64) float64 {
	return drain(a.readLoad, float64(max(nowMs-c.latestAt-c.backlogMs, 0))/a.unitMs)
}

// ownInFlight is the load this gateway's own sends to the candidate, still
// in flight at nowMs, add to its board; 0 without a counter.
func (a *ageCandidate) ownInFlight(c *Candidate, nowMs int64, board float64) float64 {
	if a.own == nil {
		return 0
	}
	return a.own.inFlight(nowMs, a.unitMs, board, c.Ceiling) / c.Ceiling
}

// count records a send to the candidate as one of this gateway's own;
// nothing without a counter.
func (a *ageCandidate) count(c *Candidate, nowMs int64, board float64) {
	if a.own != nil {
		a.own.add(nowMs, a.unitMs, board, c.Ceiling)
	}
}

func (pk *ageAwarePicker) loadAt(s *Snapshot, i int32, nowMs int64) (board, load float64) {
	c, a := &s.Candidates[i], &pk.cands[i]
	switch {
	case a.read:
		board = a.boardAt(c, nowMs)
		return board, board + a.ownInFlight(c, nowMs, board)
	case c.Measured:
		return c.RawRho, c.RawRho
	}
	return 0, 0
}

func (pk *ageAwarePicker) sent(s *Snapshot, i int32, nowMs int64, board float64) {
	pk.cands[i].count(&s.Candidates[i], nowMs, board)
}

// hasRoom reports whether a candidate read at load (with this gateway's
// own sends) has a free slot for one more request (Pick.Room).
func hasRoom(c *Candidate, load float64) bool { return load*c.Ceiling+1 <= c.Ceiling+levelSlack }

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

// pick predicts the healthy interpreted candidates' loads at nowMs
// (predict), adds this gateway's own sends still in flight, and draws
// among the candidates below the common level in proportion to the flow
// each would take to reach it: its service rate (serviceRate) times its
// distance below the level. The active set is the guarantee: a site
// predicted above the level is not drawn while one below it exists. A
// "full" flag is not consulted: it latches over the settling window, and
// excluding on it herds (measured in internal/routesim).
//
// The draw is by share, not "the least loaded of two": gateway replicas
// that read one board make one prediction, and a rule that sends each
// request to the least loaded sends every replica's requests to the same
// site, while each sees only its own sends (measured in internal/routesim,
// phases sync). Drawn by share, K replicas together pour the flow as the
// water model says. When no candidate is below the level (all at it), the
// draw is by service rate. The pick is counted in its counter. Without an
// interpreted healthy candidate the reference arms draw.
func (pk *ageAwarePicker) pick(s *Snapshot, healthy []int32, turn uint64, nowMs int64) Pick {
	var group, order, active [MaxSites]int32
	n := 0
	for _, i := range healthy {
		if pk.cands[i].interpreted {
			group[n] = i
			n++
		}
	}
	if n == 0 {
		return referencePicker{}.pick(s, healthy, turn, nowMs)
	}
	u := weyl(turn)
	var board, loads [MaxSites]float64
	level := pk.predict(s, group[:n], nowMs, board[:n], order[:n])
	minLoad := math.Inf(1)
	for k, i := range group[:n] {
		loads[k] = board[k] + pk.cands[i].ownInFlight(&s.Candidates[i], nowMs, board[k])
		minLoad = math.Min(minLoad, loads[k])
	}
	level = math.Max(level, minLoad)
	// active holds the candidates drawn from; at, their positions in
	// group; share, the water each takes to reach the level.
	var at [MaxSites]int
	var share [MaxSites]float64
	na, total := 0, 0.0
	for k, i := range group[:n] {
		if loads[k] <= level+levelSlack {
			active[na], at[na] = i, k
			share[na] = pk.serviceRate(s, i) * (level - loads[k])
			total += share[na]
			na++
		}
	}
	pick := 0
	if total > levelSlack {
		target := u * total
		for pick < na-1 {
			if target -= share[pick]; target < 0 {
				break
			}
			pick++
		}
	} else {
		pick = s.weighted(active[:na], -1, u, func(i int32) float64 { return pk.serviceRate(s, i) })
	}
	i := active[pick]
	c := &s.Candidates[i]
	pk.cands[i].count(c, nowMs, board[at[pick]])
	return Pick{Outcome: Routed, Path: PathAgeAware, Candidate: c, Room: hasRoom(c, loads[at[pick]])}
}

// serviceRate weighs an active candidate by the requests it completes per
// ms when full: its learned ceiling over its site's mean duration. A site
// whose requests take four times longer takes a quarter of the share per
// slot (grid bench routing --scenario slow-site).
func (pk *ageAwarePicker) serviceRate(s *Snapshot, i int32) float64 {
	return s.Candidates[i].Ceiling / pk.cands[i].unitMs
}
