// Package routesim is a deterministic discrete-event harness that measures
// routing quality under stale load readings. Sites are multi-slot FIFO
// servers; K gateways each route their share of the arrivals from what they
// can see: readings of every site refreshed every T mean request durations
// (at phases the Phases mode sets), ingested as the rows a real operator
// relays, through the real load store, snapshot builder and pick. Time is
// simulated; nothing sleeps.
//
// Arrivals, their gateways and their service demands come from one random
// stream, policy draws from another: every policy of a seed sees the same
// requests (common random numbers), so the difference between two policies
// is theirs, not the arrivals'.
package routesim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/signals"
)

// Policies.
const (
	WeightedRR     = "weighted-rr"
	WeightedRandom = "weighted-random"
	JSQStale       = "jsq-stale"
	P2CStale       = "p2c-stale"
	// LeastConn is nginx's least_conn: each gateway's own requests in
	// flight per site over its slots, exact, and no board at all.
	LeastConn = "least-conn"
	Reference = "reference"
	AgeAware  = "age-aware"
	// Latency is the latency policy: predicted time to first token, each
	// gateway's own site preferred by the round trip (Config.RTT), its
	// own sends weighed by their sizes (Config.Sizes).
	Latency = "latency"
	Oracle  = "oracle"

	// The variants that add this gateway's own sends since the reading to
	// what the board says (JSQ, P2C), and the default without them.
	JSQStaleOwn   = "jsq-stale+own"
	P2CStaleOwn   = "p2c-stale+own"
	AgeAwareNoOwn = "age-aware-no-own"
	// AgeAwareByShare is the default with route.AgeAwareOptions.ShareOnly:
	// the draw by share decides however many requests a gateway holds.
	AgeAwareByShare = "age-aware-by-share"
)

// Policies lists every policy, in table order.
var Policies = []string{WeightedRR, WeightedRandom, LeastConn, JSQStale, JSQStaleOwn, P2CStale, P2CStaleOwn, Reference, AgeAwareNoOwn, AgeAwareByShare, AgeAware, Latency, Oracle}

// Phases is when the readings a gateway sees refresh.
type Phases string

// Phase modes.
const (
	// PhasesRandom: each gateway refreshes every site's reading at once, at
	// its own random phase (gateways polling unrelated operators).
	PhasesRandom Phases = "random"
	// PhasesSync: every gateway refreshes every site at the same instants
	// (gateway replicas reading one operator's relay).
	PhasesSync Phases = "sync"
	// PhasesPerSite: each site's reading refreshes at its own phase, seen
	// by every gateway at once (a remote site's rows refresh on the
	// operator's peer poll of it; every gateway of the site long-polls that
	// operator).
	PhasesPerSite Phases = "per-site"
)

// AllPhases lists the phase modes, in table order.
var AllPhases = []Phases{PhasesRandom, PhasesSync, PhasesPerSite}

// Change is a scenario: what happens to the sites besides the load.
type Change string

// Scenarios.
const (
	ChangeNone Change = "none"
	// CapacitySwap reverses the sites' slots halfway through the run; the
	// run measures from 100 mean durations after the swap.
	CapacitySwap Change = "capacity-swap"
	// SlowSite: the first site's requests take four times longer.
	SlowSite Change = "slow-site"
	// SmallSites divides every site's slots by four (at least one), so
	// most sites are smaller than the ceiling floor (8).
	SmallSites Change = "small-sites"
	// ColdStart measures the requests that arrive in the first
	// windowRefreshes refresh intervals of an empty grid at full load:
	// what a site sees after a deploy, before any gateway has a reading.
	ColdStart Change = "cold-start"
	// Restart runs warmRefreshes refresh intervals, then every gateway
	// restarts (nothing learned, nothing counted; each reads the readings
	// its operator holds, with their ages) and the requests of the next
	// windowRefreshes intervals are measured.
	Restart Change = "restart"
	// ExternalLoad: clients of the biggest site send it half its
	// capacity directly, bypassing every gateway, for eventOn mean
	// durations in every eventCycle (grid bench sites' external-load,
	// whose event lasts about three mean durations, repeated so that a
	// run holds many); their requests are not measured.
	ExternalLoad Change = "external-load"
	// CapacityDrop: the biggest site has half its slots for eventOn mean
	// durations in every eventCycle (grid bench sites' capacity-drop).
	CapacityDrop Change = "capacity-drop"
)

// The ExternalLoad and CapacityDrop events last eventOn mean durations
// and come every eventCycle: long enough apart that static weights, which
// load the biggest site at 0.94 on average under the external load, drain
// its queue between them.
const eventOn, eventCycle = 3.0, 18.0

// Changes lists the scenarios.
var Changes = []Change{ChangeNone, CapacitySwap, SlowSite, SmallSites, ColdStart, Restart, ExternalLoad, CapacityDrop}

// changeSummaries say in a few words what each scenario does, for the
// command's help; every one of Changes has one (TestEveryChangeIsSummarised).
var changeSummaries = map[Change]string{
	ChangeNone:   "nothing happens",
	CapacitySwap: "slots reverse halfway; measured from 100 mean durations later",
	SlowSite:     "the first site's requests take 4× longer",
	SmallSites:   "slots divided by 4",
	ColdStart:    "the first 20 refresh intervals of an empty grid at full load",
	Restart:      "every gateway restarts after 20 refresh intervals; the next 20 measured",
	ExternalLoad: "the biggest site's own clients send it half its capacity, 3 mean durations in 18",
	CapacityDrop: "the biggest site loses half its slots, 3 mean durations in 18",
}

// Summary says in a few words what the scenario does.
func (c Change) Summary() string { return changeSummaries[c] }

// The windows of the cold-start and restart scenarios, in refresh
// intervals (T): measured for windowRefreshes after the event; the restart
// comes after warmRefreshes of warm-up.
const (
	windowRefreshes = 20
	warmRefreshes   = 20
)

// Config is one experiment.
type Config struct {
	Slots    []int
	Load     float64 // arrival rate over total service capacity
	Gateways int
	// BoardAge is T: how often, in mean request durations, the readings a
	// gateway sees are refreshed.
	BoardAge float64
	// Phases is when they refresh; empty means PhasesRandom.
	Phases   Phases
	Requests int
	Seed     uint64
	// Sigma selects lognormal service times of that σ; 0 is exponential.
	// Both have mean 1.
	Sigma float64
	// Sizes tells each gateway every request's size (its service demand,
	// as a request's max_tokens would), which the latency policy weighs
	// its own sends by.
	Sizes bool
	// RTT is the round trip, in mean durations, from each gateway to
	// every site but its own (gateway k's is site k mod the site count):
	// a request sent to another site waits it more before its first token
	// and its end. 0 is none, and no gateway has a site of its own.
	RTT float64
	// Declare has each site's operator relay the most its engines run at
	// once (signals.MaxRunning: slots over the pool's endpoints), as an
	// operator configured with `maxRunning`, or serving SGLang engines,
	// does. Off, the gateways learn every limit from the readings.
	Declare  bool
	Scenario Change
	Policy   string
}

// Result is what a run measured, in mean request durations: the time in
// system's mean and p99, and the p99 of the wait before service began
// (the time to first token, no prefill being modelled, a round trip
// included); with Config.RTT, Local is the share of requests served by
// the site of the gateway that took them.
type Result struct {
	Mean, P99, WaitP99 float64
	Local              float64
}

// unit is one mean request duration on the gateways' millisecond timeline.
const unit = 1000.0

type eventKind int

const (
	arrival eventKind = iota
	departure
	refresh // readings refresh: of one gateway or all (gw < 0), of one site or all (site < 0)
	rebuild // a gateway rebuilds its snapshot (its poll)
	swap    // the sites' capacities reverse (CapacitySwap)
	restart // every gateway restarts (Restart)
	// external is an arrival that bypasses the gateways (ExternalLoad).
	external
	// eventStart and eventEnd bound the middle third of an ExternalLoad
	// or CapacityDrop run.
	eventStart
	eventEnd
	// firstRead: a site's first reading reaches one gateway (ColdStart).
	firstRead
)

// reading is one site's published reading: its in-system count at an
// instant.
type reading struct {
	at       float64 // 0: none yet
	inSystem int
	slots    int
}

type event struct {
	at   float64
	kind eventKind
	site int     // departure, refresh, firstRead
	req  request // departure
	gw   int     // refresh, rebuild, firstRead
	seq  int
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

type request struct {
	arrived float64
	service float64
	// gw is the gateway it arrived at; -1 for an external request.
	gw int
	// sender is the gateway that sent it: after a restart, no longer
	// gws[gw].
	sender *gateway
	// rtt is the round trip it pays (Config.RTT; 0 at its gateway's own
	// site); cost and load what its pick was told and read.
	rtt  float64
	cost route.Cost
	load route.Opt
	// queued: no slot was free when it reached its site.
	queued bool
}

type site struct {
	slots   int
	running int
	queue   []request
	// slowdown multiplies the service demand of the site's requests.
	slowdown float64
}

func (s *site) inSystem() int { return s.running + len(s.queue) }

// gateway is one gateway's view: its board (for the baseline policies) and
// the real routing stack (for reference and age-aware).
type gateway struct {
	board []int // in-system counts at the last refresh
	own   []int // this gateway's sends to each site since that refresh
	// inFlight is this gateway's requests in flight at each site (a
	// restarted gateway starts at none).
	inFlight []int
	store    *loadstore.Store
	builder  *route.Builder
	snap     *route.Snapshot
	cands    []route.Candidate
	wrr      []float64 // smooth weighted round robin state
	read     []bool    // a reading of each site was ingested
	seq      int64
	turn     uint64
	// service is the age unit, learned as the gateway learns it.
	service *route.Service
	// declare relays each site's limit per endpoint (Config.Declare).
	declare bool
}

// Run simulates cfg and returns the mean and p99 time in system.
func Run(cfg Config) Result {
	arrivalRng := rand.New(rand.NewPCG(cfg.Seed, 1))  // arrivals, gateways, service demands
	rng := rand.New(rand.NewPCG(cfg.Seed, 2))         // policy draws
	phaseRng := rand.New(rand.NewPCG(cfg.Seed, 3))    // refresh and rebuild phases
	externalRng := rand.New(rand.NewPCG(cfg.Seed, 4)) // external arrivals and their demands
	firstRng := rand.New(rand.NewPCG(cfg.Seed, 5))    // which readings a cold start's first reads hold
	sites := make([]site, len(cfg.Slots))
	rate := 0.0 // completions per mean duration at full use
	for i, c := range cfg.Slots {
		sites[i] = site{slots: c, slowdown: 1}
		if cfg.Scenario == SmallSites {
			sites[i].slots = max(c/4, 1)
		}
		if cfg.Scenario == SlowSite && i == 0 {
			sites[i].slowdown = 4
		}
		rate += float64(sites[i].slots) / sites[i].slowdown
	}
	lambda := cfg.Load * rate
	windowMs := int64(math.Max(cfg.BoardAge, 0.1)*unit) + int64(unit)
	set := route.DefaultSettings
	set.WindowMs = windowMs
	// The ceiling half-life in mean durations as in production: 600 s of
	// 10 s requests.
	set.CeilingHalfLifeMs = 60 * unit
	gws := make([]*gateway, cfg.Gateways)
	// newGateway makes a gateway that knows nothing: at the start, and
	// when it restarts.
	newGateway := func() *gateway {
		g := &gateway{board: make([]int, len(sites)), own: make([]int, len(sites)), inFlight: make([]int, len(sites)), read: make([]bool, len(sites)), store: loadstore.New(time.Duration(max(3*windowMs, 60_000)) * time.Millisecond),
			wrr: make([]float64, len(sites)), turn: rng.Uint64(), declare: cfg.Declare}
		g.service = &route.Service{}
		var policy route.Policy = route.Reference{}
		switch cfg.Policy {
		case AgeAware, AgeAwareNoOwn, AgeAwareByShare:
			// The ablation reads the board alone.
			policy = route.NewAgeAware(g.service, route.AgeAwareOptions{IgnoreOwnSends: cfg.Policy == AgeAwareNoOwn, ShareOnly: cfg.Policy == AgeAwareByShare})
		case Latency:
			policy = route.NewLatency(g.service, g.service)
		}
		g.builder = route.NewBuilder(policy)
		for i := range sites {
			g.cands = append(g.cands, route.Candidate{Model: "m", Site: fmt.Sprintf("s%02d", i), Provider: "p", Upstream: &url.URL{Host: "x"}})
		}
		return g
	}
	// home is gateway k's own site with round trips, -1 without.
	home := func(k int) int {
		if cfg.RTT > 0 {
			return k % len(sites)
		}
		return -1
	}
	// placeAt makes g gateway k: its own site's candidate local, the
	// round trip to every other site measured.
	placeAt := func(g *gateway, k int) *gateway {
		if h := home(k); h >= 0 {
			g.cands[h].Local = true
			for i := range sites {
				if i != h {
					g.service.RoundTrip(g.cands[i].Site).Observe(cfg.RTT * unit)
				}
			}
		}
		return g
	}
	for k := range gws {
		gws[k] = placeAt(newGateway(), k)
	}
	// published is each site's latest reading as its operator holds it:
	// what a gateway that restarts reads first.
	published := make([]reading, len(sites))

	var q events
	seq := 0
	push := func(e event) { seq++; e.seq = seq; heap.Push(&q, e) }
	push(event{at: arrivalRng.ExpFloat64() / lambda, kind: arrival})
	T := math.Max(cfg.BoardAge, 1e-9)
	poll := math.Min(cfg.BoardAge, 0.1)
	// Only the policies that run the gateway's routing stack need its
	// store and snapshots.
	stack := throughStack(cfg.Policy)
	switch cfg.Phases {
	case PhasesSync:
		push(event{at: phaseRng.Float64() * T, kind: refresh, gw: -1, site: -1})
	case PhasesPerSite:
		for i := range sites {
			push(event{at: phaseRng.Float64() * T, kind: refresh, gw: -1, site: i})
		}
	default:
		for k := range gws {
			push(event{at: phaseRng.Float64() * T, kind: refresh, gw: k, site: -1})
		}
	}
	if stack {
		// Each gateway rebuilds on its own clock.
		for k := range gws {
			push(event{at: phaseRng.Float64()*poll + 1e-6, kind: rebuild, gw: k})
		}
	}
	// Requests count from ten refresh intervals on: before the first
	// readings nothing is measured, and with readings ten mean durations
	// apart the queues a blind start builds outlast the tenth of the run
	// that is dropped below (docs/routing.md).
	measureFrom, measureUntil := 10*T, math.Inf(1)
	switch cfg.Scenario {
	case CapacitySwap:
		swapAt := float64(cfg.Requests) / lambda / 2
		push(event{at: swapAt, kind: swap})
		measureFrom = swapAt + 100
	case ColdStart:
		measureFrom, measureUntil = 0, windowRefreshes*T
		// The idle grid's readings reach each gateway one by one, as on
		// real processes (operators start one after another, and a
		// gateway's first read may hold a peer's site before its own):
		// its first read, before any request, holds one site drawn at
		// random; each other site's first reading reaches it at a uniform
		// instant within the first refresh interval, or with its first
		// refresh if that comes sooner. The readings after them refresh
		// every T, at their phases.
		for i := range sites {
			published[i] = reading{at: 1 / unit, slots: sites[i].slots}
		}
		if stack {
			for k, g := range gws {
				first := firstRng.IntN(len(sites))
				g.ingest(published, first, 1/unit)
				for i := range sites {
					if i != first {
						push(event{at: firstRng.Float64() * T, kind: firstRead, gw: k, site: i})
					}
				}
			}
		}
	case Restart:
		restartAt := warmRefreshes * T
		push(event{at: restartAt, kind: restart})
		measureFrom, measureUntil = restartAt, restartAt+windowRefreshes*T
	case ExternalLoad, CapacityDrop:
		push(event{at: eventOn, kind: eventStart})
	}
	biggest := 0
	for i := range sites {
		if sites[i].slots > sites[biggest].slots {
			biggest = i
		}
	}
	externalRate := 0.5 * float64(sites[biggest].slots) / sites[biggest].slowdown
	externalOn := false
	// windowed: the run measures the requests of a window, not a count.
	windowed := !math.IsInf(measureUntil, 1)
	pending := 0 // requests of the window not yet departed
	service := func() float64 {
		if cfg.Sigma > 0 {
			return math.Exp(cfg.Sigma*arrivalRng.NormFloat64() - cfg.Sigma*cfg.Sigma/2)
		}
		return arrivalRng.ExpFloat64()
	}
	var times, waits []float64
	var local []bool // whether each measured request was served at its gateway's own site
	arrivals := 0
	var now float64
	// startQueued starts site i's queued requests while it has free slots.
	startQueued := func(i int) {
		s := &sites[i]
		for len(s.queue) > 0 && s.running < s.slots {
			next := s.queue[0]
			s.queue = s.queue[1:]
			s.running++
			push(event{at: now + next.service, kind: departure, site: i, req: next})
		}
	}
	// admit starts r at site i, or queues it.
	admit := func(i int, r request) {
		s := &sites[i]
		if s.running < s.slots {
			s.running++
			push(event{at: now + r.service, kind: departure, site: i, req: r})
		} else {
			r.queued = true
			s.queue = append(s.queue, r)
		}
	}
	for q.Len() > 0 && (windowed || len(times) < cfg.Requests) {
		e := heap.Pop(&q).(event)
		now = e.at
		if windowed && now >= measureUntil && pending == 0 {
			break
		}
		switch e.kind {
		case arrival:
			// Arrivals before measuring starts do not count against the
			// cap: with many sites and old readings the warm-up alone can
			// take more than four runs' worth, and a run that stopped
			// arriving before it measured anything would never end.
			if now >= measureFrom {
				arrivals++
			}
			if now >= measureFrom && now < measureUntil {
				pending++
			}
			if windowed || arrivals < cfg.Requests*4 {
				push(event{at: now + arrivalRng.ExpFloat64()/lambda, kind: arrival})
			}
			k := arrivalRng.IntN(len(gws))
			demand := service()
			var cost route.Cost
			if cfg.Sizes {
				// A token a millisecond of a mean duration's thousand.
				cost.MaxOutput = max(1, int(math.Round(demand*unit)))
			}
			i, load := choose(cfg.Policy, gws[k], sites, rng, now, cost)
			gws[k].own[i]++
			gws[k].inFlight[i]++
			if stack {
				gws[k].service.Served(gws[k].cands[i].Site, "m").Begin(int64(now * unit))
			}
			r := request{arrived: now, service: demand * sites[i].slowdown, gw: k, sender: gws[k], cost: cost, load: load}
			if h := home(k); h >= 0 && i != h {
				r.rtt = cfg.RTT
			}
			admit(i, r)
		case external:
			if !externalOn {
				break
			}
			demand := externalRng.ExpFloat64()
			if cfg.Sigma > 0 {
				demand = math.Exp(cfg.Sigma*externalRng.NormFloat64() - cfg.Sigma*cfg.Sigma/2)
			}
			admit(biggest, request{arrived: now, service: demand * sites[biggest].slowdown, gw: -1})
			push(event{at: now + externalRng.ExpFloat64()/externalRate, kind: external})
		case eventStart:
			push(event{at: now + eventOn, kind: eventEnd})
			push(event{at: now + eventCycle, kind: eventStart})
			switch cfg.Scenario {
			case ExternalLoad:
				externalOn = true
				push(event{at: now + externalRng.ExpFloat64()/externalRate, kind: external})
			case CapacityDrop:
				sites[biggest].slots = max(sites[biggest].slots/2, 1)
			}
		case eventEnd:
			externalOn = false
			if cfg.Scenario == CapacityDrop {
				sites[biggest].slots = cfg.Slots[biggest]
				startQueued(biggest)
			}
		case departure:
			s := &sites[e.site]
			s.running--
			d := now - e.req.arrived
			startQueued(e.site)
			if e.req.gw < 0 {
				break // an external request: no gateway sent it
			}
			d += e.req.rtt
			if e.req.arrived >= measureFrom && e.req.arrived < measureUntil {
				times = append(times, d)
				waits = append(waits, d-e.req.service)
				pending--
				local = append(local, e.req.rtt == 0)
			}
			// Every request streams; its first token comes as its service
			// starts (no prefill modelled), so the gateway sees the wait
			// and the service apart.
			e.req.sender.inFlight[e.site]--
			g := gws[e.req.gw]
			wait, served := (d-e.req.service)*unit, e.req.service*unit
			name := g.cands[e.site].Site
			if stack {
				g.judgeAndTeach(name, e.req, now*unit, wait, served)
			}
			g.service.ObserveStream(name, wait, served)
		case refresh:
			for k, g := range gws {
				if e.gw >= 0 && k != e.gw {
					continue
				}
				for i := range sites {
					if e.site < 0 || i == e.site {
						g.board[i] = sites[i].inSystem()
						g.own[i] = 0
					}
				}
			}
			for i := range sites {
				if e.site < 0 || i == e.site {
					published[i] = reading{at: now, inSystem: sites[i].inSystem(), slots: sites[i].slots}
				}
			}
			if stack {
				for k, g := range gws {
					if e.gw < 0 || k == e.gw {
						g.ingest(published, e.site, now)
					}
				}
			}
			push(event{at: now + T, kind: refresh, gw: e.gw, site: e.site})
		case firstRead:
			if g := gws[e.gw]; !g.read[e.site] {
				g.ingest(published, e.site, now)
			}
		case rebuild:
			g := gws[e.gw]
			g.snap = g.builder.Build(g.store, g.cands, int64(now*unit), nil, set)
			push(event{at: now + poll, kind: rebuild, gw: e.gw})
		case restart:
			for k := range gws {
				g := placeAt(newGateway(), k)
				for i, r := range published {
					g.board[i] = r.inSystem
				}
				if stack {
					g.ingest(published, -1, now)
				}
				gws[k] = g
			}
		case swap:
			for i, j := 0, len(sites)-1; i < j; i, j = i+1, j-1 {
				sites[i].slots, sites[j].slots = sites[j].slots, sites[i].slots
			}
			for i := range sites {
				startQueued(i)
			}
		}
	}
	if !windowed {
		// Drop the warm-up tenth.
		times = times[len(times)/10:]
		waits = waits[len(waits)/10:]
		local = local[len(local)/10:]
	}
	var sum float64
	for _, t := range times {
		sum += t
	}
	slices.Sort(times)
	slices.Sort(waits)
	p99 := func(sorted []float64) float64 { return sorted[int(0.99*float64(len(sorted)-1))] }
	res := Result{Mean: sum / float64(len(times)), P99: p99(times), WaitP99: p99(waits)}
	if cfg.RTT > 0 {
		n := 0
		for _, l := range local {
			if l {
				n++
			}
		}
		res.Local = float64(n) / float64(len(local))
	}
	return res
}

// judgeAndTeach hands the gateway's routing stack a stream of r that
// ended at endMs at site name, having waited waitMs (its round trip in it)
// and been served for servedMs: the wait is judged before the stream
// teaches the estimates, as the gateway does. The harness learns of a
// stream at its end: its first token is judged then, against the claims
// kept.
func (g *gateway) judgeAndTeach(name string, r request, endMs, waitMs, servedMs float64) {
	sv := g.service.Served(name, "m")
	sv.Judge(int64(endMs), g.service.Waited(name, true, endMs-waitMs-servedMs, waitMs, waitMs+servedMs, r.cost))
	sv.End(int64(endMs))
	// A request that found a free slot waited for nothing at its site.
	// Its wait as a difference of two instants is 0 only to the last bit,
	// and one read a hair above 0 (as most are, late in a run) taught the
	// cost model nothing, nor, until it knew, any wait curve
	// (TestStreamsWithRoomTeachTheCostModel).
	atSite := 0.0
	if r.queued {
		atSite = max(waitMs-r.rtt*unit, 0)
	}
	if waited, ok := g.service.Costs().WaitMs(r.cost, atSite); ok && r.load.OK {
		g.service.Waits(name).Observe(r.load.V, waited)
	}
	g.service.Costs().Observe(r.cost, atSite, servedMs, !r.queued)
}

// ingest feeds the gateway the rows an operator would relay for one site
// (only < 0: every site) as published: running, queued and ready per pool,
// the deepest queue, the limit per endpoint where the operator declares it,
// and a complete batch, at the reading's instant.
func (g *gateway) ingest(published []reading, only int, now float64) {
	var b strings.Builder
	for i, r := range published {
		if (only >= 0 && i != only) || r.at == 0 {
			continue
		}
		g.read[i] = true
		ms := int64(r.at * unit)
		lbl := fmt.Sprintf(`grid_provider="p",grid_site="s%02d"`, i)
		// A pool of one endpoint per 8 slots, as grid bench sites runs
		// it: its averages are per endpoint.
		run, queued := min(r.inSystem, r.slots), max(r.inSystem-r.slots, 0)
		ready := float64(max(r.slots/8, 1))
		g.seq++
		fmt.Fprintf(&b, "llm_d_epp_average_running_requests{%s,name=\"p\"} %g %d\n", lbl, float64(run)/ready, ms)
		fmt.Fprintf(&b, "llm_d_epp_average_queue_size{%s,name=\"p\"} %g %d\n", lbl, float64(queued)/ready, ms)
		fmt.Fprintf(&b, "llm_d_epp_ready_endpoints{%s,name=\"p\"} %g %d\n", lbl, ready, ms)
		fmt.Fprintf(&b, "llm_d_epp_per_endpoint_queue_size{%s,model_server_endpoint=\"e\",name=\"p\"} %d %d\n", lbl, queued, ms)
		samples := 4
		if g.declare {
			fmt.Fprintf(&b, "%s{%s} %g %d\n", signals.MaxRunning, lbl, float64(r.slots)/ready, ms)
			samples++
		}
		fmt.Fprintf(&b, "grid_provider_config_generation{batch_samples=\"%d\",batch_sequence=\"%d\",%s,provider_uid=\"u\",publisher_epoch=\"1\"} 1 %d\n", samples, g.seq, lbl, ms)
	}
	if b.Len() == 0 {
		return
	}
	ms := int64(now * unit)
	g.store.Ingest([]byte(b.String()), ms, ms, ms, signals.Origin{Site: "hub", Relay: true})
}

// choose routes one request of cost by policy, and returns the site and
// the load the policy read it at (where it reads one).
func choose(policy string, g *gateway, sites []site, rng *rand.Rand, now float64, cost route.Cost) (int, route.Opt) {
	if throughStack(policy) {
		if g.snap == nil {
			return rng.IntN(len(sites)), route.Opt{}
		}
		g.turn++
		p := g.snap.PickSized("m", cost, g.turn, int64(now*unit))
		if p.Candidate == nil {
			return rng.IntN(len(sites)), route.Opt{}
		}
		var i int
		fmt.Sscanf(p.Candidate.Site, "s%02d", &i)
		return i, p.Load
	}
	return chooseBaseline(policy, g, sites, rng), route.Opt{}
}

// throughStack reports whether policy runs the gateway's routing stack
// (store, builder, snapshot and pick); the baselines read the board
// directly.
func throughStack(policy string) bool {
	switch policy {
	case Reference, AgeAware, AgeAwareNoOwn, AgeAwareByShare, Latency:
		return true
	}
	return false
}

// chooseBaseline routes one request by a policy that reads the board
// directly, or nothing.
func chooseBaseline(policy string, g *gateway, sites []site, rng *rand.Rand) int {
	switch policy {
	case WeightedRR:
		// Smooth weighted round robin by slots.
		total, best := 0.0, 0
		for i := range sites {
			g.wrr[i] += float64(sites[i].slots)
			total += float64(sites[i].slots)
			if g.wrr[i] > g.wrr[best] {
				best = i
			}
		}
		g.wrr[best] -= total
		return best
	case WeightedRandom:
		return weighted(sites, rng)
	case LeastConn:
		return argmin(len(sites), func(i int) float64 { return float64(g.inFlight[i]) / float64(sites[i].slots) }, rng)
	case JSQStale, JSQStaleOwn:
		return argmin(len(sites), func(i int) float64 { return g.seen(policy, i) / float64(sites[i].slots) }, rng)
	case P2CStale, P2CStaleOwn:
		a := weighted(sites, rng)
		b := a
		for b == a && len(sites) > 1 {
			b = weighted(sites, rng)
		}
		if g.seen(policy, b)/float64(sites[b].slots) < g.seen(policy, a)/float64(sites[a].slots) {
			return b
		}
		return a
	case Oracle:
		return argmin(len(sites), func(i int) float64 { return float64(sites[i].inSystem()) / float64(sites[i].slots) }, rng)
	}
	panic("unknown policy " + policy)
}

// seen is site i's in-system count as a board policy sees it: the board,
// plus this gateway's sends since it for the +own variants.
func (g *gateway) seen(policy string, i int) float64 {
	if policy == JSQStaleOwn || policy == P2CStaleOwn {
		return float64(g.board[i] + g.own[i])
	}
	return float64(g.board[i])
}

func weighted(sites []site, rng *rand.Rand) int {
	total := 0
	for i := range sites {
		total += sites[i].slots
	}
	x := rng.IntN(total)
	for i := range sites {
		if x -= sites[i].slots; x < 0 {
			return i
		}
	}
	return len(sites) - 1
}

func argmin(n int, f func(int) float64, rng *rand.Rand) int {
	best, ties := -1, 0
	var bv float64
	for i := range n {
		v := f(i)
		switch {
		case best < 0 || v < bv:
			best, bv, ties = i, v, 1
		case v == bv:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}
