package sitebench

// Routers on a model of the sims.
//
// Some routers cannot run on processes: one that knows every engine's state
// at the instant of each pick, or one that holds the grid's requests in one
// line, is a reference point for routers that read load a second late, and
// tells a target that exact knowledge misses from one the policy misses.
// (Each rule is greedy, one request at a time: a reference point, not an
// optimal schedule.) They run here, on the cell's own workload, against a
// model of the sims the cell starts (internal/sim): engines of a few slots,
// each serving its queue first come first served, prefilling one prompt at
// a time under shared prefill, and each site's EPP sending a request to its
// engine with the shortest queue, then the fewest running. The model's
// nginx-wrr is nginx's rule on the model, so the model's distance from the
// processes is read beside the reference points, in the same table.
//
// The model leaves out what processes add: the routers' own time, timers'
// lateness, the sims' scheduling.

import (
	"container/heap"
	"fmt"
	"math"
	"time"
)

// ModelRule is a modelled router's rule.
type ModelRule string

// The modelled routers.
const (
	// ModelWRR is nginx-wrr's rule: each entry replica's own smooth
	// weighted round robin over the sites, weighted by slots.
	ModelWRR ModelRule = "nginx-wrr"
	// ModelJSQ sends to the site with the fewest requests (running and
	// queued) per slot, counted exactly at the instant.
	ModelJSQ ModelRule = "jsq"
	// ModelSiteOracle sends to the site where the request's first token
	// comes soonest, its EPP picking the engine, from every engine's exact
	// state: the greedy choice of a router that picks sites, not engines,
	// and knows everything.
	ModelSiteOracle ModelRule = "site-oracle"
	// ModelOneLine holds every request in one line for the whole grid
	// until a slot is free anywhere, then sends it to the free engine that
	// can prefill it soonest: the grid's slots as one pool, holding at the
	// gateways with exact knowledge.
	ModelOneLine ModelRule = "one-line"
)

// modelScenarios are the scenarios a modelled router can run: those that
// change the load, not the processes.
var modelScenarios = []Scenario{Steady, MixedPrompts, ExternalLoad, CapacityDrop}

// siteEvents is what happens to a site during a modelled cell, as runCell
// does it to the processes.
type siteEvents struct {
	// site is the index of the site they happen to.
	site int
	// external are requests sent to its EPP directly, bypassing the
	// router and not measured (ExternalLoad), their At from the start.
	external []Request
	// From dropAt to backAt it has dropTo engines (CapacityDrop): those
	// dropped finish what they hold and take nothing new; those back
	// start empty, as the sim's.
	dropAt, backAt time.Duration
	dropTo         int
}

// replay runs w through router m on a model of sites under t, with ev
// happening to them, and returns the outcome of each of w's requests (not
// of those that bypass the router), as a cell on processes would.
func replay(w Workload, sites []*site, replicas int, t Timing, m ModelRule, ev siteEvents) ([]outcome, error) {
	g := &modelGrid{timing: t, rule: m}
	for si, s := range sites {
		g.sites = append(g.sites, modelSite{perEngine: s.perEngine, slots: s.slots})
		g.resize(si, s.endpoints, 0)
	}
	switch m {
	case ModelWRR:
		g.wrr = make([][]int, len(sites)*replicas)
		for i := range g.wrr {
			g.wrr[i] = make([]int, len(sites))
		}
	case ModelJSQ, ModelSiteOracle, ModelOneLine:
	default:
		return nil, fmt.Errorf("no modelled router %q", m)
	}
	reqs := make([]*modelRequest, len(w.Requests))
	for i, r := range w.Requests {
		reqs[i] = &modelRequest{Request: r, entrySite: r.Entry / replicas}
		g.push(modelEvent{at: r.At, kind: arrival, req: reqs[i]})
	}
	for _, r := range ev.external {
		g.push(modelEvent{at: r.At, kind: bypass, req: &modelRequest{Request: r}, site: ev.site})
	}
	if ev.backAt > ev.dropAt {
		g.push(modelEvent{at: ev.dropAt, kind: resize, site: ev.site, engines: ev.dropTo})
		g.push(modelEvent{at: ev.backAt, kind: resize, site: ev.site, engines: sites[ev.site].endpoints})
	}
	for g.events.Len() > 0 {
		e := heap.Pop(&g.events).(modelEvent)
		switch e.kind {
		case arrival:
			g.arrive(e.req, e.at)
		case bypass:
			g.send(e.req, g.eppPick(e.site), e.at)
		case departure:
			g.depart(e.engine, e.at)
		case resize:
			g.resize(e.site, e.engines, e.at)
		}
	}
	out := make([]outcome, len(reqs))
	for i, r := range reqs {
		out[i] = outcome{at: r.At, ttft: r.first - r.At, e2e: r.done - r.At, prompt: r.PromptTokens, output: r.OutputTokens,
			site: sites[g.engines[r.engine].site].name, entrySite: sites[r.entrySite].name}
	}
	return out, nil
}

// modelRequest is one request of the workload as the model serves it.
type modelRequest struct {
	Request
	entrySite int
	// engine, first and done are set when it is admitted to a slot.
	engine      int
	first, done time.Duration
}

// modelEngine is one sim engine: slots, a queue served in order, and, under
// shared prefill, the instant its prefill is next free.
type modelEngine struct {
	site, slots int
	running     []time.Duration // the running requests' ends
	queue       []*modelRequest
	prefillFree time.Duration
}

// modelSite is a site: the engines its EPP picks from (indices into
// modelGrid.engines), of perEngine slots each; slots is its configured
// total, which nginx's weights read.
type modelSite struct {
	engines          []int
	perEngine, slots int
}

// resize gives site n engines at now: those past n finish what they hold
// and take nothing new; those added start empty.
func (g *modelGrid) resize(site, n int, now time.Duration) {
	s := &g.sites[site]
	if n <= len(s.engines) {
		s.engines = s.engines[:n:n]
		return
	}
	for len(s.engines) < n {
		s.engines = append(s.engines, len(g.engines))
		g.engines = append(g.engines, &modelEngine{site: site, slots: s.perEngine})
	}
	if g.rule == ModelOneLine {
		g.dispatchLine(now)
	}
}

type modelGrid struct {
	timing  Timing
	rule    ModelRule
	engines []*modelEngine
	sites   []modelSite
	// wrr is each entry replica's smooth weighted round robin state
	// (ModelWRR); line the grid's one line (ModelOneLine).
	wrr    [][]int
	line   []*modelRequest
	events modelEventQueue
	seq    int
}

func (g *modelGrid) arrive(r *modelRequest, now time.Duration) {
	switch g.rule {
	case ModelWRR:
		g.send(r, g.eppPick(g.smoothWRR(g.wrr[r.Entry])), now)
	case ModelJSQ:
		best, bestLoad := 0, math.Inf(1)
		for si, s := range g.sites {
			n := 0
			for _, e := range s.engines {
				n += len(g.engines[e].running) + len(g.engines[e].queue)
			}
			if l := float64(n+1) / float64(len(s.engines)*s.perEngine); l < bestLoad {
				best, bestLoad = si, l
			}
		}
		g.send(r, g.eppPick(best), now)
	case ModelSiteOracle:
		best, soonest := -1, time.Duration(math.MaxInt64)
		for si := range g.sites {
			e := g.eppPick(si)
			if first := g.firstToken(e, r, now); first < soonest {
				best, soonest = e, first
			}
		}
		g.send(r, best, now)
	case ModelOneLine:
		g.line = append(g.line, r)
		g.dispatchLine(now)
	}
}

// depart ends a request at engine: the engine's own queue (requests that
// bypassed the line included) takes the slot first.
func (g *modelGrid) depart(engine int, now time.Duration) {
	e := g.engines[engine]
	e.running = removeOne(e.running, now)
	if len(e.queue) > 0 {
		r := e.queue[0]
		e.queue = e.queue[1:]
		g.admit(r, engine, now)
	}
	if g.rule == ModelOneLine {
		g.dispatchLine(now)
	}
}

// smoothWRR is nginx's smooth weighted round robin over the sites,
// weighted by slots, on one instance's state cur.
func (g *modelGrid) smoothWRR(cur []int) int {
	best, total := 0, 0
	for si, s := range g.sites {
		cur[si] += s.slots
		total += s.slots
		if cur[si] > cur[best] {
			best = si
		}
	}
	cur[best] -= total
	return best
}

// eppPick is the sim's EPP: the site's engine with the shortest queue,
// then the fewest running, the first of equals.
func (g *modelGrid) eppPick(site int) int {
	best := -1
	for _, i := range g.sites[site].engines {
		e := g.engines[i]
		if best < 0 {
			best = i
			continue
		}
		b := g.engines[best]
		if len(e.queue) < len(b.queue) || (len(e.queue) == len(b.queue) && len(e.running)*b.slots < len(b.running)*e.slots) {
			best = i
		}
	}
	return best
}

// send queues r at engine, or admits it at once when a slot is free and
// no one waits.
func (g *modelGrid) send(r *modelRequest, engine int, now time.Duration) {
	e := g.engines[engine]
	if len(e.running) < e.slots && len(e.queue) == 0 {
		g.admit(r, engine, now)
		return
	}
	e.queue = append(e.queue, r)
}

// admit gives r a slot of engine at now: its first token after the TTFT
// and its prefill (behind the prefills admitted before it, under shared
// prefill), then one token a TPOT.
func (g *modelGrid) admit(r *modelRequest, engine int, now time.Duration) {
	e := g.engines[engine]
	r.engine = engine
	r.first, e.prefillFree = g.prefill(e.prefillFree, r.PromptTokens, now)
	r.done = r.first + time.Duration(max(r.OutputTokens-1, 0))*g.timing.TPOT
	e.running = append(e.running, r.done)
	g.push(modelEvent{at: r.done, kind: departure, engine: engine})
}

// prefill is the first token of a prompt admitted at now, and the
// instant the engine's prefill is next free after it.
func (g *modelGrid) prefill(free time.Duration, prompt int, now time.Duration) (first, nextFree time.Duration) {
	d := time.Duration(prompt) * g.timing.PrefillPerToken
	if !g.timing.SharedPrefill {
		return now + g.timing.TTFT + d, free
	}
	nextFree = max(free, now) + d
	return nextFree + g.timing.TTFT, nextFree
}

// firstToken is how long r would wait for its first token at engine if
// sent at now and nothing arrived after it: the engine run forward, its
// queue in order, then r.
func (g *modelGrid) firstToken(engine int, r *modelRequest, now time.Duration) time.Duration {
	e := g.engines[engine]
	ends := make(durationHeap, e.slots)
	for i := range ends {
		ends[i] = now // a free slot
	}
	copy(ends, e.running)
	heap.Init(&ends)
	free := e.prefillFree
	var first time.Duration
	for _, q := range append(e.queue[:len(e.queue):len(e.queue)], r) {
		start := max(now, heap.Pop(&ends).(time.Duration))
		first, free = g.prefill(free, q.PromptTokens, start)
		heap.Push(&ends, first+time.Duration(max(q.OutputTokens-1, 0))*g.timing.TPOT)
	}
	return first - now
}

// dispatchLine sends the grid's line, in order, to the sites' engines
// with a free slot, each to the one whose prefill is free soonest.
func (g *modelGrid) dispatchLine(now time.Duration) {
	for len(g.line) > 0 {
		best := -1
		for _, s := range g.sites {
			for _, i := range s.engines {
				e := g.engines[i]
				if len(e.running) < e.slots && len(e.queue) == 0 && (best < 0 || max(e.prefillFree, now) < max(g.engines[best].prefillFree, now)) {
					best = i
				}
			}
		}
		if best < 0 {
			return
		}
		g.admit(g.line[0], best, now)
		g.line = g.line[1:]
	}
}

func removeOne(xs []time.Duration, x time.Duration) []time.Duration {
	for i, v := range xs {
		if v == x {
			return append(xs[:i], xs[i+1:]...)
		}
	}
	panic("sitebench: a modelled departure of no running request")
}

// modelEvent is something that happens at an instant of a modelled cell.
type modelEvent struct {
	at   time.Duration
	seq  int // ties in order of scheduling
	kind modelEventKind
	req  *modelRequest // arrival, bypass
	// site: bypass and resize; engine: departure; engines: resize.
	site, engine, engines int
}

type modelEventKind uint8

const (
	arrival   modelEventKind = iota // a request at the router
	bypass                          // a request straight to a site's EPP
	departure                       // a request's end at an engine
	resize                          // a site's engines change
)

func (g *modelGrid) push(ev modelEvent) {
	g.seq++
	ev.seq = g.seq
	heap.Push(&g.events, ev)
}

type modelEventQueue []modelEvent

func (q modelEventQueue) Len() int { return len(q) }
func (q modelEventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q modelEventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *modelEventQueue) Push(x any)   { *q = append(*q, x.(modelEvent)) }
func (q *modelEventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

type durationHeap []time.Duration

func (h durationHeap) Len() int           { return len(h) }
func (h durationHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h durationHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *durationHeap) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *durationHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
