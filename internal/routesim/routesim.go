// Package routesim is a deterministic discrete-event harness that measures
// routing quality under stale load readings. Sites are multi-slot FIFO
// servers; K gateways each route their share of the arrivals from what they
// can see: readings of every site refreshed every T mean request durations,
// ingested as the rows a real operator relays, through the real load store,
// snapshot builder and pick. Time is simulated; nothing sleeps.
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
	Reference      = "reference"
	AgeAware       = "age-aware"
	Oracle         = "oracle"

	// The variants that add this gateway's own sends since the reading to
	// what the board says (JSQ, P2C), and the default without them.
	JSQStaleOwn   = "jsq-stale+own"
	P2CStaleOwn   = "p2c-stale+own"
	AgeAwareNoOwn = "age-aware-no-own"
)

// Policies lists every policy, in table order.
var Policies = []string{WeightedRR, WeightedRandom, JSQStale, JSQStaleOwn, P2CStale, P2CStaleOwn, Reference, AgeAwareNoOwn, AgeAware, Oracle}

// Config is one experiment.
type Config struct {
	Slots    []int
	Load     float64 // arrival rate over total capacity
	Gateways int
	// BoardAge is T: how often, in mean request durations, the readings a
	// gateway sees are refreshed.
	BoardAge float64
	Requests int
	Seed     uint64
	// Lognormal selects heavy-tailed service times (σ = 1); otherwise
	// exponential. Both have mean 1.
	Lognormal bool
	Policy    string
}

// Result is what a run measured, in mean request durations.
type Result struct {
	Mean, P99 float64
}

// unit is one mean request duration on the gateways' millisecond timeline.
const unit = 1000.0

type eventKind int

const (
	arrival eventKind = iota
	departure
	refresh // a gateway's board refreshes
	rebuild // a gateway rebuilds its snapshot (its poll)
)

type event struct {
	at   float64
	kind eventKind
	site int     // departure
	req  request // departure
	gw   int     // refresh, rebuild
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
	gw      int
}

type site struct {
	slots   int
	running int
	queue   []request
}

func (s *site) inSystem() int { return s.running + len(s.queue) }

// gateway is one gateway's view: its board (for the baseline policies) and
// the real routing stack (for reference and age-aware).
type gateway struct {
	board    []int // in-system counts at the last refresh
	own      []int // this gateway's sends to each site since that refresh
	store    *loadstore.Store
	builder  *route.Builder
	ownSends *route.OwnSends // the age-aware pick's own sends; nil for the ablation
	snap     *route.Snapshot
	cands    []route.Candidate
	wrr      []float64 // smooth weighted round robin state
	seq      int64
	turn     uint64
	durSum   float64 // observed durations of this gateway's requests
	durCount float64
}

// Run simulates cfg and returns the mean and p99 time in system.
func Run(cfg Config) Result {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b9))
	sites := make([]site, len(cfg.Slots))
	total := 0
	for i, c := range cfg.Slots {
		sites[i].slots = c
		total += c
	}
	lambda := cfg.Load * float64(total)
	windowMs := int64(math.Max(cfg.BoardAge, 0.1)*unit) + int64(unit)
	set := route.DefaultSettings
	set.WindowMs = windowMs
	set.AgeAware = cfg.Policy == AgeAware || cfg.Policy == AgeAwareNoOwn
	gws := make([]*gateway, cfg.Gateways)
	for k := range gws {
		g := &gateway{board: make([]int, len(sites)), own: make([]int, len(sites)), store: loadstore.New(time.Duration(max(3*windowMs, 60_000)) * time.Millisecond),
			wrr: make([]float64, len(sites)), turn: rng.Uint64()}
		if cfg.Policy != AgeAwareNoOwn { // the ablation: the board alone
			g.ownSends = route.NewOwnSends()
		}
		g.builder = route.NewBuilder(g.ownSends)
		for i := range sites {
			g.cands = append(g.cands, route.Candidate{Model: "m", Site: fmt.Sprintf("s%02d", i), Provider: "p", Upstream: &url.URL{Host: "x"}})
		}
		gws[k] = g
	}

	var q events
	seq := 0
	push := func(e event) { seq++; e.seq = seq; heap.Push(&q, e) }
	push(event{at: rng.ExpFloat64() / lambda, kind: arrival})
	poll := math.Min(cfg.BoardAge, 0.1)
	// Only the policies that run the gateway's routing stack need its
	// store and snapshots; the baselines read the board directly.
	stack := cfg.Policy == Reference || set.AgeAware
	for k := range gws {
		// Boards refresh at independent phases, as real gateways poll on
		// their own clocks.
		phase := rng.Float64() * math.Max(cfg.BoardAge, 1e-9)
		push(event{at: phase, kind: refresh, gw: k})
		if stack {
			push(event{at: phase + 1e-6, kind: rebuild, gw: k})
		}
	}
	service := func() float64 {
		if cfg.Lognormal {
			return math.Exp(rng.NormFloat64() - 0.5) // σ = 1, mean 1
		}
		return rng.ExpFloat64()
	}
	var times []float64
	arrivals := 0
	for q.Len() > 0 && len(times) < cfg.Requests {
		e := heap.Pop(&q).(event)
		now := e.at
		switch e.kind {
		case arrival:
			arrivals++
			if arrivals < cfg.Requests*2 {
				push(event{at: now + rng.ExpFloat64()/lambda, kind: arrival})
			}
			k := rng.IntN(len(gws))
			i := choose(cfg.Policy, gws[k], sites, rng, now)
			gws[k].own[i]++
			r := request{arrived: now, service: service(), gw: k}
			s := &sites[i]
			if s.running < s.slots {
				s.running++
				push(event{at: now + r.service, kind: departure, site: i, req: r})
			} else {
				s.queue = append(s.queue, r)
			}
		case departure:
			s := &sites[e.site]
			s.running--
			d := now - e.req.arrived
			times = append(times, d)
			gws[e.req.gw].durSum += d
			gws[e.req.gw].durCount++
			if len(s.queue) > 0 {
				next := s.queue[0]
				s.queue = s.queue[1:]
				s.running++
				push(event{at: now + next.service, kind: departure, site: e.site, req: next})
			}
		case refresh:
			g := gws[e.gw]
			for i := range sites {
				g.board[i] = sites[i].inSystem()
				g.own[i] = 0
			}
			if stack {
				g.ingest(sites, now)
			}
			push(event{at: now + math.Max(cfg.BoardAge, 1e-9), kind: refresh, gw: e.gw})
		case rebuild:
			g := gws[e.gw]
			if g.durCount > 0 {
				set.MeanDurationMs = g.durSum / g.durCount * unit
			} else {
				set.MeanDurationMs = unit
			}
			g.snap = g.builder.Build(g.store, g.cands, int64(now*unit), nil, set)
			push(event{at: now + poll, kind: rebuild, gw: e.gw})
		}
	}
	// Drop the warm-up tenth.
	times = times[len(times)/10:]
	var sum float64
	for _, t := range times {
		sum += t
	}
	slices.Sort(times)
	return Result{Mean: sum / float64(len(times)), P99: times[int(0.99*float64(len(times)-1))]}
}

// ingest feeds the gateway the rows an operator would relay for every site
// at the refresh instant: running, queued and ready per pool, the deepest
// queue, and a complete batch.
func (g *gateway) ingest(sites []site, now float64) {
	ms := int64(now * unit)
	var b strings.Builder
	for i := range sites {
		s := &sites[i]
		lbl := fmt.Sprintf(`grid_provider="p",grid_site="s%02d"`, i)
		run, queued := min(s.inSystem(), s.slots), max(s.inSystem()-s.slots, 0)
		g.seq++
		fmt.Fprintf(&b, "llm_d_epp_average_running_requests{%s,name=\"p\"} %d %d\n", lbl, run, ms)
		fmt.Fprintf(&b, "llm_d_epp_average_queue_size{%s,name=\"p\"} %d %d\n", lbl, queued, ms)
		fmt.Fprintf(&b, "llm_d_epp_ready_endpoints{%s,name=\"p\"} 1 %d\n", lbl, ms)
		fmt.Fprintf(&b, "llm_d_epp_per_endpoint_queue_size{%s,model_server_endpoint=\"e\",name=\"p\"} %d %d\n", lbl, queued, ms)
		fmt.Fprintf(&b, "grid_provider_config_generation{batch_samples=\"4\",batch_sequence=\"%d\",%s,provider_uid=\"u\",publisher_epoch=\"1\"} 1 %d\n", g.seq, lbl, ms)
	}
	g.store.Ingest([]byte(b.String()), ms, ms, ms, signals.Origin{Site: "hub", Relay: true})
}

// choose routes one request by policy.
func choose(policy string, g *gateway, sites []site, rng *rand.Rand, now float64) int {
	switch policy {
	case Reference, AgeAware, AgeAwareNoOwn:
		if g.snap == nil {
			return rng.IntN(len(sites))
		}
		g.turn++
		p := g.snap.Pick("m", g.turn, int64(now*unit), g.ownSends)
		if p.Candidate == nil {
			return rng.IntN(len(sites))
		}
		var i int
		fmt.Sscanf(p.Candidate.Site, "s%02d", &i)
		return i
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
