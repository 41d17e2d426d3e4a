package route

import (
	"math"
)

// The selection paths of the latency policy.
const (
	// PathStayLocal: the request stays on this site, whose predicted time
	// to first token is no more than any other's.
	PathStayLocal Path = PathPrefix + 1 + iota
	// PathLatency: another site would be sooner; the age-aware draw
	// decides, round trips read as load.
	PathLatency
)

// Latency picks by predicted time to first token (docs/routing.md, the
// latency policy): each site's is the round trip to it, the wait its
// predicted load makes for one more request (read through the reading's
// age as the age-aware policy reads load, and never below the waits this
// gateway observed there at that load), the prompts its engines must
// prefill first (signals.PrefillBacklog, drained through the reading's
// age), and this request's prefill at the site's pace. The local site
// takes the request while its predicted time is no more than the best
// remote site's: a remote site must win by more than its round trip.
// Otherwise the request goes where the age-aware policy would send it:
// by its own count once it holds enough, else drawn by each site's
// expected distance below the level (siteWater.spread), each remote
// site's round trip read as the load that would make a request wait as
// long. A backlog seen to persist is not held. This
// gateway's own sends count by their estimated work (CostRates.Weight),
// not one each.
//
// Its state is the age-aware policy's (own-send counters), and it reads,
// at each build, each site's round trip and observed waits and what a
// request's size costs (Observed): a pick takes no lock.
type Latency struct {
	*AgeAware
	obs Observed
}

// NewLatency returns the latency policy, reading ages in pace's units and
// what it observed of the sites in obs.
func NewLatency(pace Pace, obs Observed) *Latency {
	return &Latency{AgeAware: NewAgeAware(pace, AgeAwareOptions{}), obs: obs}
}

// Name is "latency".
func (*Latency) Name() string { return PolicyLatency }

// latencyPicker is one snapshot's reading by the latency policy: the
// age-aware reading, and per candidate its site's round trip (0 for this
// site's own providers) and observed waits.
type latencyPicker struct {
	*ageAwarePicker
	rttMs  []float64
	waits  []*WaitCurve
	costs  CostRates
	meanMs float64 // all requests' unit: a site's pace is its unit over it
}

func (p *Latency) prepare(snap *Snapshot, now int64) picker {
	lp := &latencyPicker{ageAwarePicker: p.AgeAware.prepare(snap, now).(*ageAwarePicker),
		rttMs: make([]float64, len(snap.Candidates)), waits: make([]*WaitCurve, len(snap.Candidates)),
		costs: p.obs.Costs().Rates(), meanMs: p.pace.MeanMs()}
	if !(lp.meanMs > 0) {
		lp.meanMs = DefaultServiceMs
	}
	for i := range lp.cands {
		// A backlog seen to persist is not held at all: a site whose
		// requests are long shows it in the waits its requests meet
		// (waitMs). The default holds what its turnover cannot explain
		// (holdFor); holding the whole persistence read every queue of a
		// grid near capacity as stuck (10 sites × 16 at load 0.95, sync,
		// K = 64: 1.33 mean durations against 1.21 unheld).
		lp.cands[i].holdMs = 0
	}
	rtts := map[string]float64{}
	waits := map[string]*WaitCurve{}
	for i := range snap.Candidates {
		c := &snap.Candidates[i]
		if !c.Local {
			rtt, ok := rtts[c.Site]
			if !ok {
				rtt, _ = p.obs.RoundTripMs(c.Site)
				rtts[c.Site] = rtt
			}
			lp.rttMs[i] = rtt
		}
		w, ok := waits[c.Site]
		if !ok {
			w = p.obs.Waits(c.Site)
			waits[c.Site] = w
		}
		lp.waits[i] = w
	}
	return lp
}

func (pk *latencyPicker) restrict(r *Snapshot, kept []int32) picker {
	out := &latencyPicker{ageAwarePicker: pk.ageAwarePicker.restrict(r, kept).(*ageAwarePicker),
		rttMs: make([]float64, len(kept)), waits: make([]*WaitCurve, len(kept)), costs: pk.costs, meanMs: pk.meanMs}
	for k, i := range kept {
		out.rttMs[k], out.waits[k] = pk.rttMs[i], pk.waits[i]
	}
	return out
}

// pick reads every site as the age-aware policy does, with each remote
// site's round trip added to its load as the queue that would make a
// request wait as long (round trip over the site's unit), pours the
// grid's arrivals since the readings, and predicts each site's time to
// first token at the load they leave it at. The local site takes the
// request when its time is no more than any other's; else the age-aware
// policy's own count decides once it holds enough (ownLeast), and its
// draw before. The send is counted at the request's weight.
func (pk *latencyPicker) pick(s *Snapshot, healthy []int32, cost Cost, turn uint64, nowMs int64) Pick {
	var group [MaxSites]int32
	n := pk.interpreted(healthy, &group)
	if n == 0 {
		return referencePicker{}.pick(s, healthy, cost, turn, nowMs)
	}
	var w water
	w.fill(pk.ageAwarePicker, s, group[:n], nowMs, true)
	var rtt, backlog, lanes [MaxSites]float64
	var waits [MaxSites]*WaitCurve
	local := -1
	for k, i := range group[:n] {
		c, j := &s.Candidates[i], w.slot[k]
		rtt[j], waits[j] = pk.rttMs[i], pk.waits[i]
		if c.Local {
			local = int(j)
		}
		if c.prefillTokens >= 0 {
			// The prompts a reading said wait for their first token drain
			// through the site's engines' prefill while the reading ages.
			backlog[j] += max(pk.costs.PrefillMs(Cost{Prompt: int(c.prefillTokens)})/c.units-float64(nowMs-c.latestAt), 0) * c.units
			lanes[j] += c.units
		}
	}
	for j := range w.sites[:w.n] {
		if sw := &w.sites[j]; sw.used && rtt[j] > 0 {
			sw.offset = rtt[j] / sw.unitMs
			sw.board += sw.offset
			sw.load += sw.offset
		}
	}
	level := w.level()
	weight := pk.costs.Weight(cost)
	prefillMs := pk.costs.PrefillMs(cost)
	var ttft, load, below [MaxSites]float64
	best := math.Inf(1) // the least predicted time of the other sites
	for j := range w.sites[:w.n] {
		sw := &w.sites[j]
		if !sw.used {
			continue
		}
		// The site's expected distance below the level is both the flow
		// the draw gives it and what the arrivals add to its load.
		var sigma float64
		below[j], sigma = sw.spread(level)
		load[j] = sw.load - sw.offset + below[j]
		ttft[j] = rtt[j] + waitMs(sw, load[j], sigma, waits[j]) + prefillMs*sw.unitMs/pk.meanMs
		if lanes[j] > 0 {
			ttft[j] += backlog[j] / lanes[j]
		}
		if j != local {
			best = math.Min(best, ttft[j])
		}
	}
	if local >= 0 && ttft[local] <= best {
		p := w.draw(pk.ageAwarePicker, s, group[:n], local, turn, nowMs, weight)
		p.Path, p.Load = PathStayLocal, some(load[local])
		return p
	}
	// Holding enough requests, this gateway's own count tells each
	// site's load better than the age model (the age-aware policy's step
	// 7): without it the policy trailed the default by up to 1.38×
	// (internal/routesim, one site four times slower, 16 gateways).
	if pk.ownLeast {
		if j, ok := w.ownLeast(pk.ageAwarePicker, s, group[:n], turn); ok {
			p := w.draw(pk.ageAwarePicker, s, group[:n], j, turn, nowMs, weight)
			p.Path, p.Load = PathOwnCount, some(load[j])
			return p
		}
	}
	site := w.byShare(&below, level, turn)
	p := w.draw(pk.ageAwarePicker, s, group[:n], site, turn, nowMs, weight)
	p.Path, p.Load = PathLatency, some(load[site])
	return p
}

// waitMs predicts the wait of one more request at a site at load (in
// flight over capacity, its spread sigma): the queue ahead of it, E[(N +
// 1 − C)⁺] requests for N in flight around the prediction, each a unit
// over the capacity, read through a softplus as the age-aware draw reads
// a distance; never less than the curve of waits observed at that load.
func waitMs(sw *siteWater, load, sigma float64, observed *WaitCurve) float64 {
	knee := 1 - 1/sw.capacity
	ms := sw.unitMs * sigma * softplus((load-knee)/sigma)
	if seen, ok := observed.AtMs(load); ok {
		ms = math.Max(ms, seen)
	}
	return ms
}
