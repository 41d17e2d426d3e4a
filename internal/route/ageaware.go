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
	// IgnoreOwnSends reads the board alone, without this gateway's sends
	// since the readings or its own count (an ablation of the routing
	// harness: internal/routesim's age-aware-no-own).
	IgnoreOwnSends bool
	// Uncertain draws each site by its expected distance below the level,
	// its predicted load read with the spread of what happened since its
	// readings (siteWater.spread), as the latency policy always does.
	Uncertain bool
	// ShareOnly always draws by share, however many requests this gateway
	// holds, where the default sends to the least loaded site by its own
	// count once it holds ownInformed (water.ownLeast): the policy before
	// the own count, kept as the routing harness's age-aware-by-share.
	ShareOnly bool
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
	cands     []ageCandidate
	uncertain bool // AgeAwareOptions.Uncertain
	// ownLeast: the picks go to the least loaded site by this gateway's
	// own requests once it holds enough (not AgeAwareOptions.ShareOnly).
	ownLeast bool
}

// ageCandidate is what the age-aware policy reads of one candidate.
type ageCandidate struct {
	// read: the candidate has a reading (Candidate.latestAt), or is
	// assumed; interpreted: it is also admitted for new requests, healthy
	// and measured or assumed, so the draw reads it.
	read, interpreted bool
	// slot is the place of the candidate's site among the sites of its
	// model's healthy candidates (assignSlots): the draw weighs sites,
	// whatever number of providers each claims.
	slot int32
	// readLoad is the load (in-flight over ceiling) at the latest reading.
	readLoad float64
	// holdMs is how long the reading's backlog is held before it drains
	// (boardAt, holdFor); none under the latency policy, which reads the
	// waits its requests meet instead.
	holdMs int64
	// unitMs is the candidate's mean request duration: its site's own
	// when the gateway can tell it apart (Pace.SiteMs), else all requests'.
	unitMs float64
	// own counts this gateway's sends since the reading; nil without a
	// reading, or when own sends are ignored.
	own *sendCounter
	// served is what this gateway observed of a remote candidate's site
	// serving its model (nil for this site's own providers), and trust
	// the share of the site's claimed capacity it is read at (1 without
	// observations).
	served *Served
	trust  float64
	// held is this gateway's requests at the candidate's site, local or
	// remote (for a remote site, served itself); heldThen how many it held
	// at the instant of the site's newest reading (Served.heldAt).
	held     *Served
	heldThen float64
}

// prepare interprets the snapshot (docs/routing.md): each candidate's load
// at its reading and its unit, its site, and the trust its site's
// observed service earned. The picks read them through their age at
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
	pk := &ageAwarePicker{cands: make([]ageCandidate, len(snap.Candidates)), uncertain: p.opts.Uncertain, ownLeast: !p.opts.ShareOnly && !p.opts.IgnoreOwnSends}
	// A site's unit is asked of the pace once per build, not once per
	// provider: SitePace reads both estimates' windows under their locks.
	units := map[string]float64{}
	served := map[servedKey]*Served{}
	var newest map[servedKey]int64 // each site's newest reading of the model (ownLeast)
	if pk.ownLeast {
		newest = map[servedKey]int64{}
	}
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
		a.trust = 1
		sk := servedKey{c.Site, c.Model}
		if !c.Local || pk.ownLeast {
			sv, ok := served[sk]
			if !ok {
				sv = p.pace.Served(c.Site, c.Model)
				served[sk] = sv
			}
			a.held = sv
			if !c.Local {
				a.served, a.trust = sv, sv.Trust(now)
			}
		}
		if c.latestAt == 0 {
			continue
		}
		a.read = true
		a.readLoad = c.latestInFlight / c.Ceiling
		a.holdMs = holdFor(c.backlogMs, a.readLoad, unit)
		if pk.ownLeast {
			newest[sk] = max(newest[sk], c.latestAt)
		}
		a.interpreted = c.Admission == NewAndExisting && !math.IsNaN(c.Score) && (c.Measured || c.assumed)
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
	// What each site held at its newest reading, read once all its
	// candidates' readings are known (ownLeast only).
	for i := range snap.Candidates {
		c, a := &snap.Candidates[i], &pk.cands[i]
		if at, ok := newest[servedKey{c.Site, c.Model}]; ok {
			a.heldThen = a.held.heldAt(at)
		}
	}
	pk.assignSlots(snap)
	recordClaims(snap, pk)
	for _, m := range snap.byModel {
		// The view reads what the picks draw from: the healthy candidates.
		group := make([]int32, 0, len(m.healthy))
		for _, i := range m.healthy {
			if pk.cands[i].interpreted {
				group = append(group, i)
			}
		}
		if len(group) == 0 {
			continue
		}
		var w water
		w.fill(pk, snap, group, now, false)
		level := w.pour()
		for k, i := range group {
			c := &snap.Candidates[i]
			c.Predicted = w.board[k]
			c.Active = w.sites[w.slot[k]].load <= level+levelSlack
		}
	}
	return pk
}

// recordClaims tells each remote site's observed service what its latest
// readings of the model claim (Served.claim): the newest reading's
// instant, and whether they said it had a free slot and nothing queued,
// which an answer that waited during them contradicts.
func recordClaims(snap *Snapshot, pk *ageAwarePicker) {
	type claim struct {
		at                 int64
		inFlight, ceiling  float64
		queued, unreadable bool
	}
	claims := map[*Served]*claim{}
	for i := range snap.Candidates {
		c, a := &snap.Candidates[i], &pk.cands[i]
		if a.served == nil || !a.read || c.assumed {
			continue // an assumed reading claims nothing
		}
		cl := claims[a.served]
		if cl == nil {
			cl = &claim{}
			claims[a.served] = cl
		}
		cl.at = max(cl.at, c.latestAt)
		cl.inFlight += c.latestInFlight
		cl.ceiling += c.Ceiling
		switch {
		case math.IsNaN(c.Score) || math.IsInf(c.Score, 1):
			cl.unreadable = true // excluded, or no queue reading: no claim of room
		case c.Score > 0:
			cl.queued = true
		}
	}
	for sv, cl := range claims {
		sv.claim(cl.at, !cl.queued && !cl.unreadable && cl.inFlight+1 <= cl.ceiling+levelSlack)
	}
}

// levelSlack is the rounding the active set forgives: a load within it of
// the level is at the level.
const levelSlack = 1e-9

func (pk *ageAwarePicker) restrict(r *Snapshot, kept []int32) picker {
	out := &ageAwarePicker{cands: make([]ageCandidate, len(kept)), uncertain: pk.uncertain, ownLeast: pk.ownLeast}
	for k, i := range kept {
		out.cands[k] = pk.cands[i]
	}
	out.assignSlots(r)
	return out
}

// assignSlots numbers, per model, the sites of snap's healthy candidates in
// order of first appearance, and gives each healthy candidate its site's
// number (ageCandidate.slot): at most MaxSites, since a model's healthy
// candidates are.
func (pk *ageAwarePicker) assignSlots(snap *Snapshot) {
	for _, m := range snap.byModel {
		var names [MaxSites]string
		n := int32(0)
		for _, i := range m.healthy {
			c := &snap.Candidates[i]
			j := int32(0)
			for j < n && names[j] != c.Site {
				j++
			}
			if j == n {
				names[n] = c.Site
				n++
			}
			pk.cands[i].slot = j
		}
	}
}

// water is one model's candidates read through their age at one instant,
// and their sites, which the draw weighs: a site's providers of the model
// are one bucket of the sum of their ceilings, so a site weighs what its
// capacity is, however many providers it claims it in. It lives on the
// stack of a pick: fill and pour allocate nothing.
type water struct {
	// board is each candidate's load (in-flight over its ceiling) by its
	// reading alone, load with this gateway's own sends added; slot its
	// site's place in sites. All aligned with the group.
	board, load [MaxSites]float64
	slot        [MaxSites]int32
	sites       [MaxSites]siteWater
	n           int // sites used
	// arrivals is the grid's arrivals since the readings, in slots.
	arrivals float64
}

// siteWater is one site's bucket.
type siteWater struct {
	// used: some candidate of the group is of the site; slots of sites
	// with none are skipped.
	used bool
	// ceiling sums the providers' ceilings; capacity is the share of it
	// the site is read at (its trust), the width of its bucket.
	ceiling, capacity float64
	// board is the site's load by its readings alone (in-flight over
	// capacity), load with this gateway's own sends, and, for a remote
	// site, at least this gateway's requests it holds.
	board, load float64
	// rate is the requests it completes per ms when full: its capacity
	// over its mean duration. A site whose requests take four times
	// longer takes a quarter of the share per slot (grid bench routing
	// --scenario slow-site).
	rate float64
	// served and trust are the remote site's observed service (nil for
	// this site's own providers) and the share of its claims it earned.
	served *Served
	trust  float64
	// read is its readings' capacity-weighted load at the readings: less
	// its board, what its completions since are predicted to be (spread).
	read float64
	// offset is the load the latency policy reads a remote site's round
	// trip as; board and load include it.
	offset float64
	// unitMs is its providers' capacity-weighted unit: its mean request
	// duration.
	unitMs float64
}

// fill reads group (interpreted candidates of one model, at most
// MaxSites) at nowMs into w; withOwn adds this gateway's own sends and
// what it observes a remote site hold.
//
// The grid's arrival rate (per ms) is what its busy slots complete in
// steady state, each site's at its own pace. Capacity here is the learned
// ceiling itself: the explore floor that lifts small sites' weights in the
// reference draws would overfill them here (measured in internal/routesim).
func (w *water) fill(pk *ageAwarePicker, s *Snapshot, group []int32, nowMs int64, withOwn bool) {
	var rate, meanAgeMs, capSum float64
	for k, i := range group {
		c, a := &s.Candidates[i], &pk.cands[i]
		rate += math.Min(a.readLoad, 1) * c.Ceiling / a.unitMs
		meanAgeMs += float64(max(nowMs-c.latestAt, 0)) * c.Ceiling
		capSum += c.Ceiling
		w.board[k] = a.boardAt(c, nowMs)
		w.load[k] = w.board[k]
		if withOwn {
			w.load[k] += a.ownInFlight(c, nowMs, w.board[k])
		}
		j := a.slot
		sw := &w.sites[j]
		if !sw.used {
			*sw = siteWater{used: true, served: a.served, trust: a.trust}
			w.n = max(w.n, int(j)+1)
		}
		w.slot[k] = j
		sw.ceiling += c.Ceiling
		sw.read += a.readLoad * c.Ceiling
		sw.unitMs += a.unitMs * c.Ceiling
		sw.board += w.board[k] * c.Ceiling
		sw.load += w.load[k] * c.Ceiling
		sw.rate += c.Ceiling / a.unitMs
	}
	w.arrivals = rate * meanAgeMs / capSum
	for j := range w.sites[:w.n] {
		sw := &w.sites[j]
		if !sw.used {
			// A site of the model none of whose candidates is in the
			// group: never reached by the pour, never drawn.
			sw.board, sw.load = math.Inf(1), math.Inf(1)
			continue
		}
		sw.board /= sw.ceiling
		sw.load /= sw.ceiling
		sw.read /= sw.ceiling
		sw.unitMs /= sw.ceiling
		sw.capacity = sw.ceiling
		if !withOwn || sw.served == nil {
			continue
		}
		// A remote site is read at the share of its claims its observed
		// service earned, and as holding at least this gateway's requests
		// it holds: what the gateway sees it serve is not the site's to
		// say (docs/routing.md, earned capacity).
		sw.capacity = sw.ceiling * sw.trust
		sw.rate *= sw.trust
		sw.board /= sw.trust
		sw.load = max(sw.load/sw.trust, sw.served.InFlight()/sw.capacity)
	}
}

// pour returns the common level: each site drains from its readings as
// its busy slots complete (boardAt), while the grid's arrivals since the
// readings flow to the least-loaded sites in proportion to their
// capacity, raising them together. The sites whose predicted load has
// reached the level form the active set. On a fresh board the flow goes to
// the least loaded; on an old one by capacity, which is right when the
// board says nothing any more.
func (w *water) pour() float64 {
	var order [MaxSites]int32
	for j := range w.n {
		order[j] = int32(j)
	}
	// Groups are small: an insertion sort allocates nothing.
	for j := 1; j < w.n; j++ {
		for m := j; m > 0 && w.sites[order[m]].board < w.sites[order[m-1]].board; m-- {
			order[m], order[m-1] = order[m-1], order[m]
		}
	}
	var filled, weighted float64
	level := w.sites[order[0]].board
	for j, k := range order[:w.n] {
		sw := &w.sites[k]
		filled += sw.capacity
		weighted += sw.capacity * sw.board
		level = (w.arrivals + weighted) / filled
		if j+1 == w.n || level <= w.sites[order[j+1]].board {
			break
		}
	}
	return level
}

// holdFor is how long a backlog read to have persisted for backlogMs is
// held before it drains (boardAt): its persistence beyond the time the site
// takes to turn over what it holds, load units (its queue drains at the
// full service rate, then its last request completes in about a unit). A
// queue that persists no longer than that is what a full site shows while
// its requests turn over, at any pace: no evidence, and holding it read
// every queue of a grid near its capacity as stuck (internal/routesim, 10
// sites × 16 at load 0.98, 64 gateways on one board: 1.55 mean durations,
// 1.38 held for the excess only, stale P2C 1.44). Past it, the site serves
// slower than the unit says: a batch of long completions sent to it
// directly.
func holdFor(backlogMs int64, load, unitMs float64) int64 {
	return max(backlogMs-int64(load*unitMs), 0)
}

// boardAt is the candidate's load (in-flight over its ceiling) at nowMs
// by its latest reading alone: drained through the reading's age in the
// site's own unit. A backlog seen to persist across readings longer than
// its requests explain is held for the excess before it drains (holdFor):
// a site whose requests are longer than the unit says (a batch of long
// completions sent to it directly) drains far slower, and its persistence
// is the evidence (docs/routing.md).
func (a *ageCandidate) boardAt(c *Candidate, nowMs int64) float64 {
	return drain(a.readLoad, float64(max(nowMs-c.latestAt-a.holdMs, 0))/a.unitMs)
}

// ownInFlight is the load this gateway's own sends to the candidate, still
// in flight at nowMs, add to its board; 0 without a counter.
func (a *ageCandidate) ownInFlight(c *Candidate, nowMs int64, board float64) float64 {
	if a.own == nil {
		return 0
	}
	return a.own.inFlight(nowMs, a.unitMs, board, c.Ceiling) / c.Ceiling
}

// count records a send of weight mean requests to the candidate as one of
// this gateway's own; nothing without a counter.
func (a *ageCandidate) count(c *Candidate, nowMs int64, board, weight float64) {
	if a.own != nil {
		a.own.add(nowMs, a.unitMs, board, c.Ceiling, weight)
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
	pk.cands[i].count(&s.Candidates[i], nowMs, board, 1)
}

// hasRoom reports whether a candidate read at load (with this gateway's
// own sends) has a free slot for one more request (Pick.Room).
func hasRoom(c *Candidate, load float64) bool { return load*c.Ceiling+1 <= c.Ceiling+levelSlack }

// spread is the load the site is expected to take to reach level (in its
// capacity's units), its predicted load being uncertain: the flow a
// site would take is level − load on the prediction alone, and here it is
// E[(level − X)⁺] for X around the prediction with the standard deviation
// of what happened since the readings. A site just above the level may
// then be drawn, and one far below it takes about its distance: replicas
// that share a board spread their requests over the sites the board
// cannot tell apart instead of pouring them on one prediction.
//
// Only the latency policy reads it (and AgeAwareOptions.Uncertain). The
// age-aware policy's model drains a backlog it has stopped holding as its unit says,
// and the completions that predicts widen the spread most where the model
// is most wrong: an engine filled by a client's 3 s requests, read by a
// gateway whose requests take 100 ms, was sent 3 to 6 of 10 requests
// once its hold ran out (e2e TestRealVLLMSimulatorTwoSites, none before);
// the harness tables moved by at most 0.01 with it.
//
// The variance counts, in requests, the completions the model predicts
// since the readings (the load they read less the board's drained
// prediction, as Poisson: a backlog the model holds predicts none) and
// the arrivals the level gives the site (Poisson); over its capacity
// squared, in load. The expectation is read through a softplus (a
// logistic X), which needs no error function. It returns the expectation
// and sigma, that standard deviation (in load).
func (sw *siteWater) spread(level float64) (below, sigma float64) {
	completions := max(sw.read-(sw.board-sw.offset), 0)
	arrivals := max(level-sw.load, 0)
	sigma = math.Sqrt((completions+arrivals)/sw.capacity) + levelSlack
	return sigma * softplus((level-sw.load)/sigma), sigma
}

// softplus is ln(1 + eᶻ), the expected excess E[(z − X)⁺] of a standard
// logistic X.
func softplus(z float64) float64 {
	if z > 30 {
		return z
	}
	return math.Log1p(math.Exp(z))
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

// pick predicts the healthy interpreted candidates' loads at nowMs,
// adds this gateway's own sends still in flight, and draws among the sites
// below the common level (pour) in proportion to the flow each would take
// to reach it: its service rate times its distance below the level; then,
// within the site drawn, among its providers by the room each has for one
// more request (within). The active set is the guarantee: a site
// predicted above the level is not drawn while one below it exists. A
// "full" flag is not consulted: it latches over the settling window, and
// excluding on it herds (measured in internal/routesim).
//
// The draw is by share, not "the least loaded of two": gateway replicas
// that read one board make one prediction, and a rule that sends each
// request to the least loaded sends every replica's requests to the same
// site, while each sees only its own sends (measured in internal/routesim,
// phases sync). Drawn by share, K replicas together pour the flow as the
// water model says. When no site is below the level (all at it), the
// draw is by service rate. The pick is counted in its counter. Without an
// interpreted healthy candidate the reference arms draw.
func (pk *ageAwarePicker) pick(s *Snapshot, healthy []int32, cost Cost, turn uint64, nowMs int64) Pick {
	var group [MaxSites]int32
	n := pk.interpreted(healthy, &group)
	if n == 0 {
		return referencePicker{}.pick(s, healthy, cost, turn, nowMs)
	}
	var w water
	w.fill(pk, s, group[:n], nowMs, true)
	if pk.ownLeast {
		if j, ok := w.ownLeast(pk, s, group[:n], turn); ok {
			p := w.draw(pk, s, group[:n], j, turn, nowMs, 1)
			p.Path = PathOwnCount
			return p
		}
	}
	level := w.level()
	below := w.distances(level, pk.uncertain)
	return w.draw(pk, s, group[:n], w.byShare(&below, level, turn), turn, nowMs, 1)
}

// ownLeast returns the site whose load, as this gateway's own requests
// tell it, is least, once the gateway holds at least ownInformed
// requests over the group's sites; ok is false before that.
//
// A gateway knows its own requests at each site exactly, now, where the
// board is a reading as old as its age. The grid's other gateways route
// by the same rule, so each site holds about k times this gateway's
// requests there, k the grid's requests over its own at the readings;
// what a site's reading showed beyond k times this gateway's requests
// then (a client sending to the site directly, replicas that draw
// unalike) is added as it was read: a load from outside the gateways
// persists. Each replica counts different requests, so the replicas that
// read one board do not send to one site, as the least loaded site by the
// board alone would have them do. With few requests of its own a
// gateway's count says little, and the draw by share decides.
func (w *water) ownLeast(pk *ageAwarePicker, s *Snapshot, group []int32, turn uint64) (int, bool) {
	held, ok := w.ownHeld(pk, s, group, nil)
	if !ok {
		return 0, false
	}
	best, least, ties := -1, math.Inf(1), 0
	for j := range w.sites[:w.n] {
		if !w.sites[j].used {
			continue
		}
		switch v := held[j] / w.sites[j].capacity; {
		case v < least:
			best, least, ties = j, v, 1
		case v == least:
			// Ties drawn evenly: the n-th of them replaces the pick
			// with probability 1/n.
			ties++
			if unit(turn, salt0+uint64(ties)) < 1/float64(ties) {
				best = j
			}
		}
	}
	return best, best >= 0
}

// ownHeld is what each site holds of the model by this gateway's own
// count (ownLeast), in requests: k × own + max(read − k × then, 0). ok is
// false while the gateway holds fewer than ownInformed requests over the
// group's sites, when its count says too little. With backlogged set,
// it also says which sites' newest readings show a backlog, and k is
// read from the other sites when there are any: a backlog is where
// clients bypassing the gateways show (their requests are in the reading
// and not in any gateway's count), and counted into k they would read
// every site's gateways' part as larger than it is.
func (w *water) ownHeld(pk *ageAwarePicker, s *Snapshot, group []int32, backlogged *[MaxSites]bool) (held [MaxSites]float64, ok bool) {
	var own, then, read [MaxSites]float64
	var counted, backlog [MaxSites]bool
	var sumOwn float64
	for _, i := range group {
		c, a := &s.Candidates[i], &pk.cands[i]
		site := a.slot
		read[site] += c.latestInFlight
		backlog[site] = backlog[site] || c.backlog
		if !counted[site] {
			counted[site] = true
			own[site], then[site] = a.held.InFlight(), a.heldThen
			sumOwn += own[site]
		}
	}
	if sumOwn < ownInformed {
		return held, false
	}
	var sumThen, sumRead, clearThen, clearRead float64
	for j := range w.sites[:w.n] {
		sumThen += then[j]
		sumRead += read[j]
		if !backlog[j] {
			clearThen += then[j]
			clearRead += read[j]
		}
	}
	if backlogged != nil {
		*backlogged = backlog
		if clearThen > 0 {
			sumThen, sumRead = clearThen, clearRead
		}
	}
	k := 1.0
	if sumThen > 0 {
		k = max(sumRead/sumThen, 1)
	}
	for j := range w.sites[:w.n] {
		if w.sites[j].used {
			held[j] = k*own[j] + max(read[j]-k*then[j], 0)
		}
	}
	return held, true
}

// full reports whether every site of the model is full for a request
// this gateway holds (Snapshot.Full): by its own count (ownHeld), one
// more request would wait in each one's queue, or the site's newest
// reading shows a backlog, whose queue takes any slot that frees there
// before a request sent now arrives. It is false while the count says
// too little, and when the policy reads no candidate: the gateway then
// does not know the grid is full, and sends. It counts nothing.
func (pk *ageAwarePicker) full(s *Snapshot, healthy []int32, nowMs int64) bool {
	if !pk.ownLeast {
		return false
	}
	var group [MaxSites]int32
	n := pk.interpreted(healthy, &group)
	if n == 0 {
		return false
	}
	var w water
	w.fill(pk, s, group[:n], nowMs, true)
	var backlog [MaxSites]bool
	held, ok := w.ownHeld(pk, s, group[:n], &backlog)
	if !ok {
		return false
	}
	for j := range w.sites[:w.n] {
		if sw := &w.sites[j]; sw.used && !backlog[j] && held[j]+1 <= sw.capacity+levelSlack {
			return false
		}
	}
	return true
}

// PathOwnCount: the age-aware policy's own count decided (ownLeast).
const PathOwnCount Path = PathLatency + 1

// ownInformed is how many requests a gateway must hold over a model's
// sites before its own count decides its picks (ownLeast): below it, with
// many replicas each holding a few, the counts are too coarse and the
// draw by share routes better (internal/routesim, 16 and 64 gateways).
const ownInformed = 8

// interpreted puts the positions of healthy that the policy reads into
// group and returns how many.
func (pk *ageAwarePicker) interpreted(healthy []int32, group *[MaxSites]int32) int {
	n := 0
	for _, i := range healthy {
		if pk.cands[i].interpreted {
			group[n] = i
			n++
		}
	}
	return n
}

// level is the common level the grid's arrivals since the readings fill
// the sites to (pour), at least the least loaded site's load.
func (w *water) level() float64 {
	level := w.pour()
	minLoad := math.Inf(1)
	for j := range w.sites[:w.n] {
		minLoad = math.Min(minLoad, w.sites[j].load)
	}
	return math.Max(level, minLoad)
}

// distances is each site's distance below level, the flow it would take
// to reach it in its capacity's units: expected (spread) when uncertain,
// else on the prediction alone.
func (w *water) distances(level float64, uncertain bool) (below [MaxSites]float64) {
	for j := range w.sites[:w.n] {
		sw := &w.sites[j]
		switch {
		case !sw.used:
		case uncertain:
			below[j], _ = sw.spread(level)
		default:
			below[j] = max(level-sw.load, 0)
		}
	}
	return below
}

// byShare draws a site's slot in proportion to the flow each would take
// to reach level: its service rate times its distance below it (below,
// from distances); with every site at the level, by service rate.
func (w *water) byShare(below *[MaxSites]float64, level float64, turn uint64) int {
	var share [MaxSites]float64
	total := 0.0
	for j := range w.sites[:w.n] {
		if sw := &w.sites[j]; sw.used {
			share[j] = sw.rate * below[j]
			total += share[j]
		}
	}
	if total <= levelSlack {
		// All at the level: by service rate.
		for j := range w.sites[:w.n] {
			if sw := &w.sites[j]; sw.load <= level+levelSlack {
				share[j] = sw.rate
				total += share[j]
			}
		}
	}
	return drawShare(share[:w.n], total, weyl(turn))
}

// draw sends the request to the site in slot site: to one of its
// providers (within), counted as one of this gateway's own sends of
// weight mean requests.
func (w *water) draw(pk *ageAwarePicker, s *Snapshot, group []int32, site int, turn uint64, nowMs int64, weight float64) Pick {
	k := w.within(s, group, int32(site), unit(turn, salt1))
	i := group[k]
	c, a := &s.Candidates[i], &pk.cands[i]
	a.count(c, nowMs, w.board[k], weight)
	// Room is the site's: a provider of an eighth of a slot never has a
	// whole one, and its site's answers would then never teach the pace.
	sw := &w.sites[site]
	room := sw.load*sw.capacity+1 <= sw.capacity+levelSlack
	return Pick{Outcome: Routed, Path: PathAgeAware, Candidate: c, Room: room, Load: some(sw.load)}
}

// within draws, among the providers of the site in slot site, one for one
// more request: the request is poured into the least loaded of them, each
// drawn in proportion to the room it has below the level the request
// raises the site to; when none is below it, by ceiling. It returns a
// position in group.
func (w *water) within(s *Snapshot, group []int32, site int32, u float64) int {
	sw := &w.sites[site]
	var loadSum float64
	for k, i := range group {
		if w.slot[k] == site {
			loadSum += w.load[k] * s.Candidates[i].Ceiling
		}
	}
	level := (loadSum + 1) / sw.ceiling
	var share [MaxSites]float64
	total := 0.0
	for k, i := range group {
		if w.slot[k] == site {
			share[k] = s.Candidates[i].Ceiling * max(level-w.load[k], 0)
			total += share[k]
		}
	}
	if total <= levelSlack {
		for k, i := range group {
			if w.slot[k] == site {
				share[k] = s.Candidates[i].Ceiling
				total += share[k]
			}
		}
	}
	return drawShare(share[:len(group)], total, u)
}

// drawShare draws a position of share, in proportion to it, by u in
// [0, 1); positions of zero share are never drawn.
func drawShare(share []float64, total, u float64) int {
	target, last := u*total, 0
	for k, v := range share {
		if v <= 0 {
			continue
		}
		last = k
		if target -= v; target < 0 {
			return k
		}
	}
	return last
}
