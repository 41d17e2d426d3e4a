// Package route turns the load store into routing decisions: it reads each
// candidate site's load through its window (docs/protocol.md §4.10), learns
// capacity and saturation, orders candidates and latches shedding into an
// immutable snapshot built off the request path (§4.11), and picks a site
// for each request from that snapshot alone (§4.12).
package route

import (
	"math"
	"sort"

	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/signals"
)

// Opt is an optional value.
type Opt struct {
	V  float64
	OK bool
}

func some(v float64) Opt { return Opt{v, true} }

// Metric name lists, current name first.
var (
	runningNames = []string{signals.EPPAverageRunning, signals.LegacyAverageRunning}
	queueNames   = []string{signals.EPPAverageQueue, signals.LegacyAverageQueue}
	readyNames   = []string{signals.EPPReadyEndpoints, signals.LegacyReadyPods}
	unitNames    = []string{signals.LegacyPerPodQueue, signals.EPPPerEndpointQueue}
	kvNames      = []string{signals.EPPAverageKV, signals.LegacyAverageKV}
)

// Reading is what a site's samples say within a window (docs/protocol.md §4.10).
type Reading struct {
	// SampledAt is the newest sample of any metric.
	SampledAt Opt
	// Unready: the latest ready count is 0 and nothing newer arrived, or
	// the per-unit series stopped while the ready count kept stamping.
	Unready bool
	// InFlight is the window-worst of (running + queued) × ready + held,
	// each instant read together.
	InFlight Opt
	// CongestedInFlight is the same, over instants with a backlog only.
	CongestedInFlight Opt
	// PerUnit is the capacity evidence the two bounds learn, per ready
	// unit (an endpoint of a pool, an engine of a server): each instant's
	// counts over its own ready count, so that a site whose units go
	// unready or return is read at its new size at once.
	PerUnit UnitReading
	// LatestInFlight is the in-flight count of the newest joined instant,
	// and LatestAt that instant: what the age-aware policy starts from.
	LatestInFlight Opt
	LatestAt       int64
	// CongestedSince is the first instant of the run of congested instants
	// that ends at LatestAt (absent when the newest instant has no
	// backlog): how long the reading's backlog has been seen to persist.
	CongestedSince Opt
	Queued         Opt
	Held           Opt
	DeepestQueue   Opt
	// KV is the window-worst KV-cache mean plus its spread, 0..1.
	KV Opt
	// Ready is the latest ready count (endpoints of a pool, engines of a
	// server): the units the ceiling floor is credited per.
	Ready Opt
	// PrefillTokens is the prompt tokens waiting for their first token at
	// LatestAt (signals.PrefillBacklog), absent where the provider does
	// not publish them.
	PrefillTokens Opt
	// MaxRunning is the most requests one ready unit runs at once, as its
	// operator relays it at LatestAt (signals.MaxRunning): configured, or
	// declared by the engine. Absent where nobody says it.
	MaxRunning Opt
}

// UnitReading is a Reading's capacity evidence per ready unit.
type UnitReading struct {
	// InFlight is the most in flight per unit (running + queued, and held
	// work over the ready count) at any instant: the soft bound learns it
	// when nothing waited in the window.
	InFlight Opt
	// MostRunning is the most requests seen running at once per unit at
	// any instant, waiting or not: concurrency the provider has
	// demonstrably served (the soft bound learns from it).
	MostRunning Opt
	// LeastCongestedRunning is the least running per unit over instants
	// with a backlog: requests waited while that many ran, so a unit runs
	// at most that many at once (the hard bound). The in-flight count at
	// those instants includes the backlog, and a site that herding keeps
	// deep in a queue is never seen congested at a count near its size.
	LeastCongestedRunning Opt
}

// plausible keeps a finite value up to 1e6, clamping negatives to 0.
func plausible(x float64) Opt {
	if math.IsNaN(x) || math.IsInf(x, 0) || x > 1e6 {
		return Opt{}
	}
	return some(max(x, 0))
}

func latest(s []loadstore.Sample) (loadstore.Sample, bool) {
	if len(s) == 0 {
		return loadstore.Sample{}, false
	}
	return s[len(s)-1], true
}

// firstPresent returns the first name with any sample, else the first.
func firstPresent(v *loadstore.View, names []string) string {
	for _, n := range names {
		if len(v.Series[n]) > 0 {
			return n
		}
	}
	return names[0]
}

func inWindow(s []loadstore.Sample, now, window int64) []loadstore.Sample {
	lo := sort.Search(len(s), func(i int) bool { return s[i].At >= now-window })
	hi := sort.Search(len(s), func(i int) bool { return s[i].At > now })
	return s[lo:hi]
}

// windowWorst is the largest plausible value in the window.
func windowWorst(s []loadstore.Sample, now, window int64) Opt {
	var out Opt
	for _, x := range inWindow(s, now, window) {
		if p := plausible(x.Value); p.OK && (!out.OK || p.V > out.V) {
			out = p
		}
	}
	return out
}

func at(s []loadstore.Sample, t int64) Opt {
	i := sort.Search(len(s), func(i int) bool { return s[i].At >= t })
	if i < len(s) && s[i].At == t {
		return some(s[i].Value)
	}
	return Opt{}
}

// Read reads a site's view at now over window (ms).
func Read(v *loadstore.View, now, window int64, queueFull float64) Reading {
	var r Reading
	for _, s := range v.Series {
		if l, ok := latest(s); ok && (!r.SampledAt.OK || float64(l.At) > r.SampledAt.V) {
			r.SampledAt = some(float64(l.At))
		}
	}
	readyName := firstPresent(v, readyNames)
	ready, haveReady := latest(v.Series[readyName])
	unitName := firstPresent(v, unitNames)
	if units, ok := latest(v.Series[unitName]); ok && haveReady && ready.At-units.At > window {
		return Reading{Unready: true, SampledAt: r.SampledAt}
	}
	running := v.Series[firstPresent(v, runningNames)]
	queue := v.Series[firstPresent(v, queueNames)]
	readyS := v.Series[readyName]
	flow := v.Series[signals.EPPFlowControlQueue]
	for _, lead := range inWindow(running, now, window) {
		rn, rd := plausible(lead.Value), plausible(at(readyS, lead.At).V)
		if !rn.OK || !at(readyS, lead.At).OK || !rd.OK {
			continue
		}
		q := plausible(at(queue, lead.At).V)
		h := plausible(at(flow, lead.At).V)
		x := plausible((rn.V+q.V)*rd.V + h.V)
		if !x.OK {
			continue
		}
		if !r.InFlight.OK || x.V > r.InFlight.V {
			r.InFlight = x
		}
		congested := q.V >= queueFull || h.V >= 1
		// An instant without a ready unit (frozen averages) says nothing
		// of a unit's capacity.
		if u := &r.PerUnit; rd.V >= 1 {
			if !u.MostRunning.OK || rn.V > u.MostRunning.V {
				u.MostRunning = rn
			}
			if perUnit := x.V / rd.V; !u.InFlight.OK || perUnit > u.InFlight.V {
				u.InFlight = some(perUnit)
			}
			if congested && (!u.LeastCongestedRunning.OK || rn.V < u.LeastCongestedRunning.V) {
				u.LeastCongestedRunning = rn
			}
		}
		r.LatestInFlight, r.LatestAt = x, lead.At
		if !congested {
			r.CongestedSince = Opt{}
		} else {
			if !r.CongestedSince.OK {
				r.CongestedSince = some(float64(lead.At))
			}
			if !r.CongestedInFlight.OK || x.V > r.CongestedInFlight.V {
				r.CongestedInFlight = x
			}
		}
	}
	for _, n := range queueNames {
		if w := windowWorst(v.Series[n], now, window); w.OK {
			r.Queued = w
			break
		}
	}
	r.Held = windowWorst(flow, now, window)
	for _, n := range unitNames {
		if w := windowWorst(v.Series[n], now, window); w.OK {
			r.DeepestQueue = w
			break
		}
	}
	if kv := windowWorst(v.Series[firstPresent(v, kvNames)], now, window); kv.OK {
		spread := windowWorst(v.Series[signals.EPPStdDevKV], now, window)
		r.KV = some(min(1, kv.V+spread.V))
	}
	if haveReady {
		r.Ready = plausible(ready.Value)
	}
	if r.LatestInFlight.OK {
		if v := at(v.Series[signals.PrefillBacklog], r.LatestAt); v.OK {
			r.PrefillTokens = plausible(v.V)
		}
		if v := at(v.Series[signals.MaxRunning], r.LatestAt); v.OK && v.V >= 1 {
			r.MaxRunning = plausible(v.V)
		}
	}
	if haveReady && ready.Value < 1 && (!r.SampledAt.OK || r.SampledAt.V <= float64(ready.At)) {
		r.Unready = true
	}
	// The operator's verdict excludes the same way (docs/protocol.md §7): a 0
	// stands until something newer arrives. An operator that judges a
	// provider unready (its scrapes time out, say) keeps publishing the
	// verdict but no load rows, so this is the only ready series for an
	// engine kind or a provider that cannot be scraped.
	if verdict, ok := latest(v.Series[signals.Ready]); ok && verdict.Value < 1 && r.SampledAt.V <= float64(verdict.At) {
		r.Unready = true
	}
	return r
}
