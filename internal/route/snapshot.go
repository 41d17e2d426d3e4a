package route

import (
	"math"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/signals"
)

// Admission says whether a candidate takes new requests.
type Admission uint8

// Admissions.
const (
	NewAndExisting Admission = iota
	// Excluded: its latest ready count is zero (or its pool drained) and
	// no later reading said otherwise.
	Excluded
	// ExistingOnly: its operator drains it (signals.AdmitExistingOnly):
	// the sessions bound to it stay, new requests go elsewhere.
	ExistingOnly
	// Closed: its operator takes it out (signals.AdmitNone): nothing goes
	// there, bound sessions included.
	Closed
)

// AdmissionOf is the admission a provider's operator declared.
func AdmissionOf(a signals.Admission) Admission {
	switch a {
	case signals.AdmitExistingOnly:
		return ExistingOnly
	case signals.AdmitNone:
		return Closed
	}
	return NewAndExisting
}

// Tri is a three-valued flag.
type Tri int8

// Tri values.
const (
	Unknown Tri = iota
	No
	Yes
)

func tri(b bool) Tri {
	if b {
		return Yes
	}
	return No
}

// Candidate is one provider of one site that serves a model. Its fields are
// what the builder read and learned of it, each with one meaning; what a
// policy derives from them is the policy's own (its picker), except the two
// view fields Predicted and Active.
type Candidate struct {
	Model    string
	Site     string
	Provider string
	// Local marks this site's own provider; a remote one is reached
	// through its site's gateway.
	Local bool
	// Upstream is where requests go; nil means no route.
	Upstream *url.URL

	Admission Admission
	// Score orders candidates: the queue depth, +Inf without a queue
	// reading, NaN when excluded or demoted.
	Score    float64
	Measured bool
	// Capacity is the weight of draws (after the explore floor); Ceiling
	// the effective learned bound the count is read against.
	Capacity float64
	Ceiling  float64
	Rho      float64
	// RawRho is the latest reading's saturation before smoothing: room is
	// decided from it (docs/routing.md).
	RawRho float64
	// InFlight is the in-flight count over the load window the rho was
	// computed from.
	InFlight float64
	// Predicted and Active are the policy's reading of the candidate at
	// the build, for the view and the metrics: its predicted present load
	// over its ceiling (NaN where the policy predicts none), and whether
	// it is among those the policy draws new requests from.
	Predicted float64
	Active    bool
	// latestInFlight is the in-flight count of the latest reading, taken
	// at latestAt, the timeline instant of that reading (0: none).
	latestInFlight float64
	latestAt       int64
	// backlogMs is how long the backlog of the latest reading had been
	// seen to persist by then (0 without a backlog); backlog is whether
	// the latest reading has one.
	backlogMs int64
	backlog   bool
	// units is the latest ready count (at least 1), and prefillTokens the
	// prompt tokens the latest reading says wait for their first token
	// (-1: not published).
	units, prefillTokens float64
	Full                 Tri
	Relieved             Tri
	// Learnable is false while the site's batch metadata is missing or
	// incomplete.
	Learnable bool
	// assumed: unmeasured, never measured, and first seen by the builder
	// within the load window: read as idle since then at the ceiling floor
	// (latestAt is that instant), so that a gateway whose readings arrive
	// one by one after a start does not pour every request into the
	// sites read first (docs/routing.md, a cold start).
	assumed bool
}

// ReadingAt is the timeline instant of the candidate's latest reading, and
// whether it has one.
func (c *Candidate) ReadingAt() (int64, bool) {
	return c.latestAt, c.latestAt != 0 && !c.assumed
}

// Key returns the candidate's store key.
func (c *Candidate) Key() loadstore.Key { return loadstore.Key{Site: c.Site, Provider: c.Provider} }

// Settings are the availability knobs (docs/protocol.md §3.4): how every
// policy's candidates are measured, learned and shed. How they are drawn
// from is the Policy's.
type Settings struct {
	Shedding          bool
	Smoothing         float64
	CeilingHalfLifeMs float64
	CeilingFloor      float64
	ExploreFloor      float64
	FullAfterMs       int64
	RoomAfterMs       int64
	QueueFull         float64
	// WindowMs is the load window readings look through.
	WindowMs int64
	// SingleCeiling selects the reference code's one decayed ceiling
	// instead of the soft and hard bounds with the KV term.
	SingleCeiling bool
}

// DefaultSettings are the reference defaults with a 5s load window.
var DefaultSettings = Settings{
	Smoothing: 0.3, CeilingHalfLifeMs: 600_000, CeilingFloor: 8, ExploreFloor: 0.25,
	FullAfterMs: 5000, RoomAfterMs: 2000, QueueFull: 1, WindowMs: 5000,
}

// Snapshot is an immutable routing view. The request path reads nothing
// else: its candidates, and its picker, the policy's reading of them (a
// picker's own-send counters are the one thing the request path writes).
type Snapshot struct {
	Candidates []Candidate
	// byModel indexes, per model, the candidates that serve it.
	byModel  map[string]*modelIndex
	Shedding map[string]bool
	BuiltAt  int64
	// picker draws among the candidates; nil draws by the reference arms.
	picker picker
}

// modelIndex lists one model's candidates by position in the snapshot, in
// snapshot order, and the two lists a pick starts from, fixed when the
// snapshot is assembled.
type modelIndex struct {
	all []int32
	// routable: admitted for new requests and with an upstream, at most
	// MaxSites; healthy: of those (the first MaxSites), not demoted.
	routable, healthy []int32
	// admitted: some candidate takes new requests, routable or not.
	admitted bool
}

// NewSnapshot assembles a snapshot from ordered candidates, for views
// derived from a built one (the hop view, tests). It draws by the reference
// arms until a policy's picker is set.
func NewSnapshot(cands []Candidate, shedding map[string]bool, builtAt int64) *Snapshot {
	s := &Snapshot{Candidates: cands, byModel: map[string]*modelIndex{}, Shedding: shedding, BuiltAt: builtAt}
	if s.Shedding == nil {
		s.Shedding = map[string]bool{}
	}
	for i := range cands {
		c := &cands[i]
		m := s.byModel[c.Model]
		if m == nil {
			m = &modelIndex{}
			s.byModel[c.Model] = m
		}
		m.all = append(m.all, int32(i))
		if c.Admission != NewAndExisting {
			continue
		}
		m.admitted = true
		if c.Upstream == nil {
			continue
		}
		m.routable = append(m.routable, int32(i))
		if !math.IsNaN(c.Score) {
			m.healthy = append(m.healthy, int32(i))
		}
	}
	for _, m := range s.byModel {
		m.routable = fairly(cands, m.routable)
		m.healthy = fairly(cands, m.healthy)
	}
	return s
}

// fairly caps list (positions in cands, in snapshot order) at MaxSites so
// that no site crowds another out: while the list is too long, each site
// keeps its first providers in turn (the first of every site, then the
// second, …), and the kept ones stay in snapshot order. Without it, a
// peer claiming 64 idle providers filled every place ahead of an honest
// site and took all its traffic (docs/security.md).
func fairly(cands []Candidate, list []int32) []int32 {
	if len(list) <= MaxSites {
		return list
	}
	rank := make([]int, len(list))
	seen := map[string]int{}
	for k, i := range list {
		rank[k] = seen[cands[i].Site]
		seen[cands[i].Site]++
	}
	kept := make([]int32, 0, MaxSites)
	for r := 0; len(kept) < MaxSites; r++ {
		for k, i := range list {
			if rank[k] == r && len(kept) < MaxSites {
				kept = append(kept, i)
			}
		}
	}
	// Back to snapshot order.
	sort.Slice(kept, func(a, b int) bool { return kept[a] < kept[b] })
	return kept
}

// Restrict is the snapshot narrowed to the candidates keep accepts, in the
// same order, read by the same policy: its picker's reading of each kept
// candidate, its own-send counters and the shedding latch carry over (the
// hop view: docs/gateway.md).
func (s *Snapshot) Restrict(keep func(*Candidate) bool) *Snapshot {
	var cands []Candidate
	var kept []int32
	for i := range s.Candidates {
		if keep(&s.Candidates[i]) {
			cands = append(cands, s.Candidates[i])
			kept = append(kept, int32(i))
		}
	}
	r := NewSnapshot(cands, s.Shedding, s.BuiltAt)
	if s.picker != nil {
		r.picker = s.picker.restrict(r, kept)
	}
	return r
}

// draws is the snapshot's picker.
func (s *Snapshot) draws() picker {
	if s.picker == nil {
		return referencePicker{}
	}
	return s.picker
}

// Models lists the models some candidate serves, sorted.
func (s *Snapshot) Models() []string {
	out := make([]string, 0, len(s.byModel))
	for m := range s.byModel {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// learned is what the builder carries across refreshes for one candidate.
type learned struct {
	bounds     bounds
	rho        float64
	atMs       int64
	sampleAt   int64
	fullSince  Opt
	generation int
}

// bounds are a candidate's capacity bounds, per ready unit (the whole
// provider's under the single ceiling).
type bounds struct {
	// soft is the soft bound: the most the unit was shown to serve at
	// once, never below the ceiling floor. Under the single ceiling it is
	// the whole decayed ceiling, and the only field read back.
	soft float64
	// shown is what the traffic demonstrated, apart from the floor: the
	// most held per unit with nothing waiting, or the most seen running.
	// Kept apart so that a floor lowered later (a relayed limit that
	// arrives after the first readings) lowers the soft bound, and so
	// that the hard bound grows back only as far as was shown.
	shown float64
	// hard is the least running seen at an instant with a backlog, grown
	// back by the half-life; unset until a backlog shows one.
	hard Opt
}

// Builder rebuilds snapshots from the store; rebuilds are serialised and
// each result is swapped in atomically.
type Builder struct {
	// mu serialises rebuilds and guards learned, firstSeen, prevShed and
	// policy (and what the policy keeps across builds).
	mu      sync.Mutex
	learned map[loadstore.Key]*learned
	// firstSeen is the instant each candidate of the latest build first
	// appeared in a build (assumed candidates).
	firstSeen map[loadstore.Key]int64
	prevShed  map[string]bool
	policy    Policy
	// current is read by any goroutine.
	current atomic.Pointer[Snapshot]
}

// NewBuilder returns a builder whose current snapshot is empty and whose
// snapshots policy reads (nil: the reference policy).
func NewBuilder(policy Policy) *Builder {
	if policy == nil {
		policy = Reference{}
	}
	b := &Builder{learned: map[loadstore.Key]*learned{}, firstSeen: map[loadstore.Key]int64{}, prevShed: map[string]bool{}, policy: policy}
	b.current.Store(NewSnapshot(nil, nil, 0))
	return b
}

// SetPolicy makes policy read the snapshots built from now on (a reload
// that changes availability.policy); what the builder learned is kept.
func (b *Builder) SetPolicy(policy Policy) {
	if policy == nil {
		policy = Reference{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.policy = policy
}

// Policy is the policy the next build uses.
func (b *Builder) Policy() Policy {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.policy
}

// Forget drops what the builder and its policy learned of keys the store
// forgot, so a provider that returns starts learning afresh and nothing is
// held for providers gone for good.
func (b *Builder) Forget(keys []loadstore.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range keys {
		delete(b.learned, k)
		delete(b.firstSeen, k)
	}
	b.policy.forget(keys)
}

// Current is the latest snapshot: one atomic load.
func (b *Builder) Current() *Snapshot { return b.current.Load() }

// Build computes a snapshot from the store for the base candidates (in
// configuration order), at timeline instant now. down reports candidates
// whose upstream is failing; they are demoted.
func (b *Builder) Build(store *loadstore.Store, base []Candidate, now int64, down func(*Candidate) bool, set Settings) *Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	cands := append([]Candidate(nil), base...)
	// Capacity a provider has not demonstrated (the ceiling floor, the
	// explore floor) is credited per site and model, not per provider: a
	// site's providers of one model share one floor, so a site that claims
	// 64 idle providers weighs no more than one that claims one
	// (docs/routing.md, docs/security.md). What a provider demonstrated, by
	// holding requests, is its own.
	providers := map[[2]string]int{}
	for i := range cands {
		providers[[2]string{cands[i].Site, cands[i].Model}]++
	}
	share := func(c *Candidate) float64 { return 1 / float64(providers[[2]string{c.Site, c.Model}]) }
	for i := range cands {
		s := set
		s.CeilingFloor *= share(&cands[i])
		cands[i].Predicted = math.NaN()
		b.measure(store, &cands[i], now, s)
	}
	// Explore floor: no measured site weighs less than a share of the
	// largest, so a site that idles keeps getting enough work to be seen.
	largest := 0.0
	for i := range cands {
		if cands[i].Measured {
			largest = max(largest, cands[i].Capacity)
		}
	}
	for i := range cands {
		if cands[i].Measured {
			cands[i].Capacity = max(cands[i].Capacity, largest*set.ExploreFloor*share(&cands[i]))
		}
	}
	b.assume(cands, now, set, share)
	sortByScore(cands)
	if down != nil {
		demoted := false
		for i := range cands {
			if down(&cands[i]) {
				cands[i].Score = math.NaN()
				demoted = true
			}
		}
		if demoted {
			sortByScore(cands)
		}
	}
	snap := NewSnapshot(cands, nil, now)
	b.shed(snap, set)
	snap.picker = b.policy.prepare(snap, now)
	b.current.Store(snap)
	return snap
}

// assume marks the candidates a gateway has not read yet since they
// appeared, within the load window, as assumed: idle since they appeared,
// at the ceiling floor (shared per site and model, as undemonstrated
// capacity is). A gateway's readings arrive one by one after it starts
// (its own site's after a peer's, when its operator's first scrape is
// still under way), and a policy that drew only on the sites read first
// sent them every request until the others were read, then starved them
// while those requests held their readings up: a cold start herded on
// real processes (BENCHMARKS.md). An assumed site is drawn as a site
// read long ago is, by capacity, with this gateway's own sends counted;
// past the load window, still unread, it is an unmeasured candidate (a
// site whose load is unknown is not idle). firstSeen keeps only the
// candidates of this build.
func (b *Builder) assume(cands []Candidate, now int64, set Settings, share func(*Candidate) float64) {
	present := make(map[loadstore.Key]bool, len(cands))
	for i := range cands {
		c := &cands[i]
		k := c.Key()
		present[k] = true
		seen, ok := b.firstSeen[k]
		if !ok {
			seen = now
			b.firstSeen[k] = now
		}
		if c.Measured || b.learned[k] != nil || now-seen >= set.WindowMs ||
			c.Admission != NewAndExisting || math.IsNaN(c.Score) {
			continue
		}
		c.assumed = true
		c.latestAt, c.latestInFlight = max(seen, 1), 0
		c.Ceiling = max(set.CeilingFloor*share(c), 1)
		c.Capacity = c.Ceiling
		c.units, c.prefillTokens = 1, -1
	}
	for k := range b.firstSeen {
		if !present[k] {
			delete(b.firstSeen, k)
		}
	}
}

// measure reads one candidate and applies what the builder learned of it.
func (b *Builder) measure(store *loadstore.Store, c *Candidate, now int64, set Settings) {
	c.Score = math.Inf(1)
	view, ok := store.View(c.Key())
	if !ok {
		return
	}
	c.Learnable = view.Learnable
	r := Read(&view, now, set.WindowMs, set.QueueFull)
	settle := set.RoomAfterMs
	if r.SampledAt.OK {
		settle = max(settle, now-int64(r.SampledAt.V)+1)
	}
	recent := Read(&view, now, settle, set.QueueFull)
	if r.Unready {
		c.Admission = Excluded
	}
	if r.InFlight.OK {
		// Capacity is learned from the current provider identity's samples
		// only: an engine that restarted or was reconfigured is not the
		// one that held the old in-flight counts.
		lr, lrecent := r, recent
		if since := view.IdentitySince; since > now-set.WindowMs {
			lr = Read(&view, now, now-since, set.QueueFull)
			lrecent = Read(&view, now, min(settle, now-since), set.QueueFull)
		}
		b.learn(c, &view, r, lr, lrecent, now, set)
	}
	switch {
	case c.Admission == Excluded || c.Admission == Closed:
		c.Score = math.NaN()
	case r.Queued.OK:
		c.Score = r.Queued.V
	}
}

// learn updates the candidate's capacity bounds and smoothed rho from a
// reading with an in-flight count (docs/protocol.md §4.11): the bounds, the
// saturation read against them, and how long the candidate has been full.
//
// r is the reading over the load window; learnFrom and recent (over the
// settling window) are read from the current identity's samples only.
func (b *Builder) learn(c *Candidate, v *loadstore.View, r, learnFrom, recent Reading, now int64, set Settings) {
	key := c.Key()
	prev := b.learned[key]
	if prev != nil && prev.generation != v.Generation {
		prev = nil // a new provider identity: learning starts over
	}
	sampleAt := min(int64(r.SampledAt.V), now)
	// Capacity is learned per ready unit (an endpoint of a pool, an
	// engine of a server) and read at the latest ready count: a pool of
	// four ready endpoints is, until it shows more, four engines of the
	// floor's size, not one (a cold start keeps the proportions of sites
	// of like engines), and one whose endpoints go unready, or return, is
	// read at its new size at once rather than once a backlog shows it
	// (docs/routing.md, capacity).
	units := 1.0
	if r.Ready.OK && r.Ready.V > 1 {
		units = r.Ready.V
	}
	bounds, effective := learnBounds(prev, v.Learnable, learnFrom, recent, units, now, set)
	raw, rho := saturation(prev, r, effective, sampleAt, set)
	congested := recent.CongestedInFlight.OK && recent.CongestedInFlight.V >= effective
	fullSince := fullSince(prev, congested, now, set)
	if recent.Queued.OK {
		c.Full = tri(fullSince.OK && now-int64(fullSince.V) >= set.FullAfterMs)
		c.Relieved = tri(!congested)
	}
	b.learned[key] = &learned{bounds: bounds, rho: rho, atMs: now, sampleAt: sampleAt, fullSince: fullSince, generation: v.Generation}
	c.Measured = true
	c.Capacity, c.Ceiling, c.Rho, c.RawRho, c.InFlight = effective, effective, rho, raw, r.InFlight.V
	c.units, c.prefillTokens = units, -1
	if r.LatestInFlight.OK {
		c.latestAt, c.latestInFlight = r.LatestAt, r.LatestInFlight.V
		if r.CongestedSince.OK {
			c.backlogMs, c.backlog = r.LatestAt-int64(r.CongestedSince.V), true
		}
		if r.PrefillTokens.OK {
			c.prefillTokens = r.PrefillTokens.V
		}
	}
}

// learnBounds returns the capacity bounds per ready unit (docs/protocol.md
// §4.11) and the effective ceiling the in-flight count is read against:
// their lesser times units, the latest ready count. The soft bound is the
// most held with nothing queued, or the most seen running at once, never
// below the floor; the hard bound is the least running at a demonstrated
// limit, growing back by the half-life no further than what the unit was
// shown to run. The queued part of a sample teaches nothing, and a sample
// without a whole batch teaches neither bound. Under the single ceiling
// (the reference's model) the soft bound is the whole ceiling, learned from
// samples with nothing waiting only, decayed by the half-life, and floored
// at the ceiling floor per unit.
func learnBounds(prev *learned, learnable bool, r, recent Reading, units float64, now int64, set Settings) (b bounds, effective float64) {
	decay := 1.0
	if prev != nil {
		decay = math.Pow(0.5, float64(max(now-prev.atMs, 0))/set.CeilingHalfLifeMs)
	}
	waiting := (r.Queued.OK && r.Queued.V >= 1) || (r.DeepestQueue.OK && r.DeepestQueue.V >= 1) || (r.Held.OK && r.Held.V >= 1)
	if set.SingleCeiling {
		// The reference's single ceiling decays, so that a site that
		// shrank is re-learned.
		var decayed, clean float64
		if prev != nil {
			decayed = prev.bounds.soft * decay
		}
		if learnable && !waiting {
			clean = r.InFlight.V
		}
		b.soft = max(decayed, clean, set.CeilingFloor*units)
		return b, b.soft
	}
	// Under the two bounds the hard bound learns a shrink (a backlog at a
	// lower running count), and what was shown does not decay: decayed,
	// the soft bound fell below the capacity of a site the traffic did not
	// fill, which then drew less, showed less, and was starved
	// (docs/routing.md).
	//
	// clean is the most held per unit with nothing waiting; taught adds
	// the most seen running per unit at any instant, queue or not: the
	// queued part of an in-flight count teaches nothing, the running part
	// was served.
	var clean, taught float64
	if learnable {
		if !waiting {
			clean = r.PerUnit.InFlight.V
		}
		taught = max(clean, r.PerUnit.MostRunning.V)
	}
	b.shown = taught
	if prev != nil {
		b.shown = max(prev.bounds.shown, taught)
	}
	// The floor credits a unit no more than its operator or engine says
	// it runs at once; what a unit was seen to run stands over either.
	floor := set.CeilingFloor
	if r.MaxRunning.OK {
		floor = min(floor, r.MaxRunning.V)
	}
	b.soft = max(b.shown, floor)
	if prev != nil && prev.bounds.hard.OK {
		// The demonstrated limit grows back out by the half-life, but no
		// further than the unit was shown to run: past that only the
		// floor would lift it, and an engine smaller than the floor would
		// be credited the floor once a half-life, sent a backlog, and
		// teach its limit anew (TestSmallerThanTheFloorLearnsItsLimit).
		last := prev.bounds.hard.V
		b.hard = some(min(last/decay, max(last, b.shown)))
	}
	if least := recent.PerUnit.LeastCongestedRunning; learnable && least.OK && least.V*units >= 1 && (!b.hard.OK || least.V < b.hard.V) {
		b.hard = least
	}
	if b.hard.OK && clean > b.hard.V {
		b.hard = Opt{} // held more than the "limit" with nothing queued: it moved
	}
	if !b.hard.OK {
		return b, b.soft * units
	}
	// The floor guards what has not been shown (the soft bound); a limit a
	// backlog demonstrated is read as it is, so an engine smaller than the
	// floor is not credited with slots it does not have.
	return b, max(min(b.soft, b.hard.V)*units, 1)
}

// saturation returns the reading's raw saturation against the effective
// ceiling (the nearer to 1 of the in-flight ratio and the KV-cache mean,
// under the two bounds) and its exponentially smoothed value, which moves
// once per new sample.
func saturation(prev *learned, r Reading, effective float64, sampleAt int64, set Settings) (raw, rho float64) {
	raw = clamp01(r.InFlight.V / effective)
	if !set.SingleCeiling && r.KV.OK {
		raw = max(raw, clamp01(r.KV.V))
	}
	switch {
	case prev == nil:
		return raw, raw
	case prev.sampleAt == sampleAt:
		return raw, prev.rho
	}
	return raw, prev.rho*(1-set.Smoothing) + raw*set.Smoothing
}

// fullSince is when the candidate's current congested spell began, carried
// across rebuilds while they stay within one load window of each other.
func fullSince(prev *learned, congested bool, now int64, set Settings) Opt {
	if !congested {
		return Opt{}
	}
	if prev != nil && now-prev.atMs <= set.WindowMs && prev.fullSince.OK {
		return prev.fullSince
	}
	return some(float64(now))
}

func clamp01(x float64) float64 { return max(0, min(1, x)) }

// sortByScore orders ascending under a total order in which NaN is greater
// than everything; ties keep their order.
func sortByScore(c []Candidate) {
	sort.SliceStable(c, func(i, j int) bool { return less(c[i].Score, c[j].Score) })
}

func less(a, b float64) bool {
	switch {
	case math.IsNaN(a):
		return false
	case math.IsNaN(b):
		return true
	}
	return a < b
}

// shed latches shedding per model (docs/protocol.md §4.11 step 7).
func (b *Builder) shed(snap *Snapshot, set Settings) {
	type group struct{ n, full, measured, relieved int }
	groups := map[string]*group{}
	for i := range snap.Candidates {
		c := &snap.Candidates[i]
		if c.Admission != NewAndExisting || math.IsNaN(c.Score) {
			continue
		}
		g := groups[c.Model]
		if g == nil {
			g = &group{}
			groups[c.Model] = g
		}
		g.n++
		if c.Full != Unknown && c.Relieved != Unknown {
			g.measured++
		}
		if c.Full == Yes {
			g.full++
		}
		if c.Relieved == Yes {
			g.relieved++
		}
	}
	next := map[string]bool{}
	for model, g := range groups {
		fully := g.measured == g.n
		if set.Shedding && fully && g.n > 0 && (g.full == g.n || (b.prevShed[model] && g.relieved == 0)) {
			next[model] = true
		}
	}
	snap.Shedding = next
	b.prevShed = next
}
