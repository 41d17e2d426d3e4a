package operator

import (
	"math"
	"time"

	"github.com/grid-inference/grid/internal/backend"
)

// refreshPhase learns when a backend that recomputes its gauges every
// period (metrics.refreshInterval: the EPP's pool gauges) recomputes them,
// from what its scrapes serve, so that the provider's scrapes fall just
// after each recomputation and each reading is stamped with the instant
// its values were computed (docs/operator.md, refresh phase). A scrape at
// a blind phase serves values between 0 and a whole period old; stamped
// half a period before the scrape, each reading was off by up to half a
// period either way, and every gateway of the grid read the same error
// into the same site.
//
// A recomputation shows where two scrapes less than a period apart serve
// different values: it fell between the first's start and the second's
// end. The instants it can fall at form a window (from, from + width]
// that repeats every period, and each such bracket narrows it. While the
// window is wider than phaseGoal, each period carries a probe scrape at
// its middle, so each recomputation that changes the values halves it;
// once narrow, the probe sits just before it, and a change seen outside
// it says the backend's refresh moved (a restart, a clock step): the
// window is learnt again from that bracket. Values that do not change say
// nothing: an idle pool recomputes the same averages.
//
// Only the provider's scrape loop touches it (Pass, in tests, alike).
type refreshPhase struct {
	period time.Duration
	// from and width place the window; started is false before the
	// first scrape.
	from    time.Time
	width   time.Duration
	started bool
	// lastStart and lastGauges are the latest scrape that served the
	// gauges: when it started and what it served; haveLast is false
	// before one, or after a scrape that served none. lastProbe: that
	// scrape was a probe. tickGauges is what the latest publishing scrape
	// served (haveTick).
	lastStart  time.Time
	lastGauges poolGauges
	haveLast   bool
	lastProbe  bool
	tickGauges poolGauges
	haveTick   bool
	// took is how long scrapes take (a moving mean): every bracket is
	// widened by as much, so the window narrows no further than about
	// twice it.
	took time.Duration
	// missed counts the publishing scrapes in a row whose values changed
	// since the one before but not since the probe just before them: the
	// recomputation fell before the probe, outside the window.
	missed int
	// relearned counts the windows dropped for a change seen outside
	// them.
	relearned int
}

// phaseMisses is how many publishing scrapes in a row may find their
// recomputation before their probe before the window is learnt again: a
// scrape interval of several periods brackets no recomputation between a
// probe and the publishing scrape before it.
const phaseMisses = 3

// phaseMargin is how long after a window's end a scrape falls, and how
// long before its start the narrow window's probe does: the backend's own
// timer and its recomputation are not instant.
const phaseMargin = 5 * time.Millisecond

// phaseGoal is the width at which the window stops being narrowed, for
// a period: a fiftieth of it, at least 20 ms (a scrape's own duration
// widens every bracket by as much).
func phaseGoal(period time.Duration) time.Duration {
	return max(period/50, 20*time.Millisecond)
}

func newRefreshPhase(period time.Duration) *refreshPhase {
	return &refreshPhase{period: period}
}

// observe folds one scrape into the window: it started at start, ended at
// end, and served the pool gauges in served (ok false: a failed scrape, or one
// without them); probe says it was a probe.
func (ph *refreshPhase) observe(start, end time.Time, served poolGauges, ok, probe bool) {
	if !ph.started {
		// Some recomputation falls within any period.
		ph.from, ph.width, ph.started = start, ph.period, true
	}
	if took := end.Sub(start); ph.took == 0 {
		ph.took = took
	} else {
		ph.took += (took - ph.took) / 8
	}
	if !ok {
		ph.haveLast, ph.haveTick = false, false
		return
	}
	if ph.haveLast && served != ph.lastGauges && end.Sub(ph.lastStart) < ph.period {
		ph.narrow(ph.lastStart, end)
	}
	if !probe {
		switch {
		case !ph.haveLast || !ph.lastProbe || !ph.haveTick:
		case !ph.known():
			// The probe was at the window's middle.
			ph.missed = 0
		case served == ph.lastGauges && served != ph.tickGauges:
			if ph.missed++; ph.missed >= phaseMisses {
				ph.width, ph.missed = ph.period, 0
				ph.relearned++
			}
		case served != ph.lastGauges:
			ph.missed = 0
		}
		ph.tickGauges, ph.haveTick = served, true
	}
	ph.lastStart, ph.lastGauges, ph.haveLast, ph.lastProbe = start, served, true, probe
}

// narrow intersects the window with a bracket (lo, hi], shorter than a
// period, that holds a recomputation. A bracket that meets the window in
// two pieces (a window wider than the gap between them) leaves it as it
// is; one that misses it replaces it.
func (ph *refreshPhase) narrow(lo, hi time.Time) {
	length := hi.Sub(lo)
	if ph.width >= ph.period {
		// Nothing learnt yet: the window is every instant.
		ph.from, ph.width = lo, length
		return
	}
	d := mod(lo.Sub(ph.from), ph.period) // the bracket's start, in the window's frame
	// The bracket is (d, d+length], and where it wraps also
	// (d-period, d+length-period]; the window is (0, width].
	a0, a1 := d, min(d+length, ph.width)
	b1 := min(d+length-ph.period, ph.width)
	first, second := a1 > a0, b1 > 0
	switch {
	case first && second:
		return
	case first:
		ph.from, ph.width = ph.from.Add(a0), a1-a0
	case second:
		ph.width = b1
	default:
		ph.from, ph.width = lo, length
		ph.relearned++
	}
}

// known reports whether the window is narrow enough to place scrapes by:
// at most phaseGoal, or about as narrow as the scrapes' own duration lets
// it be.
func (ph *refreshPhase) known() bool {
	return ph.started && ph.width <= phaseGoal(ph.period)+2*ph.took
}

// windowEndAfter is the first instant, a margin past a window's end,
// after t.
func (ph *refreshPhase) windowEndAfter(t time.Time) time.Time {
	end := ph.from.Add(ph.width + phaseMargin)
	k := math.Floor(float64(t.Sub(end))/float64(ph.period)) + 1
	return end.Add(time.Duration(k) * ph.period)
}

// nextTick is when the scrape after the one that started at last
// publishes: just after a recomputation, as near to interval after last
// as a whole number of periods allows (every period while the window is
// learnt); with an interval shorter than the period, every interval and
// also just after each recomputation. Before the first scrape, last plus
// interval.
func (ph *refreshPhase) nextTick(last time.Time, interval time.Duration) time.Time {
	switch {
	case !ph.started:
		return last.Add(interval)
	case interval < ph.period:
		return minTime(last.Add(interval), ph.windowEndAfter(last))
	case !ph.known():
		interval = ph.period
	}
	return ph.windowEndAfter(last.Add(interval - ph.period/2))
}

// probeBefore is the probe scrape of the period whose window ends just
// before tick: the window's middle while it is wide, a margin before its
// start once narrow. ok is false when tick does not follow a window, or
// nothing has been scraped yet.
func (ph *refreshPhase) probeBefore(tick time.Time) (at time.Time, ok bool) {
	if !ph.started {
		return time.Time{}, false
	}
	end := ph.windowEndAfter(tick.Add(-ph.period / 2))
	if !end.Equal(tick) {
		return time.Time{}, false
	}
	start := end.Add(-phaseMargin - ph.width)
	if ph.known() {
		return start.Add(-phaseMargin), true
	}
	return start.Add(ph.width / 2), true
}

// servedAt is when the values a scrape that started at start served were
// computed: the middle of the latest window that began before it, once
// that window has ended; when start falls within the window (or the
// window is a whole period, nothing learnt), the recomputation may or may
// not have passed, and the reading is stamped half a period back, the
// mean age of a blind scrape.
func (ph *refreshPhase) servedAt(start time.Time) time.Time {
	d := mod(start.Sub(ph.from), ph.period)
	if d == 0 {
		d = ph.period
	}
	if from := start.Add(-d); ph.started && !from.Add(ph.width).After(start) {
		return from.Add(ph.width / 2)
	}
	return start.Add(-ph.period / 2)
}

// mod is d modulo m, in [0, m).
func mod(d, m time.Duration) time.Duration {
	r := d % m
	if r < 0 {
		r += m
	}
	return r
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// poolGauges is what a backend recomputes on its refresh: the pool's
// averages and its ready count (the per-endpoint series and the in-flight
// counts are live, and change between recomputations). Parsed values are
// never NaN, so == compares them.
type poolGauges struct {
	running, queue, ready  float64
	queueKnown, readyKnown bool
}

// gaugesOf is a reading's poolGauges; ok is false for a reading without
// the averages.
func gaugesOf(r *backend.Reading) (g poolGauges, ok bool) {
	if r == nil || r.Load.AverageRunning == nil {
		return poolGauges{}, false
	}
	g.running = *r.Load.AverageRunning
	if q := r.Load.AverageQueue; q != nil {
		g.queue, g.queueKnown = *q, true
	}
	g.ready, g.readyKnown = r.Ready.Value, r.Ready.Known
	return g, true
}
