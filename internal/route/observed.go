package route

import (
	"math"
	"sync/atomic"
)

// What a gateway observes of the sites it sends to, beside their service
// time (Service): the round trip to each peer site's gateway, and the waits
// its requests met against the load each site was predicted at. The
// latency policy reads both; a site's board cannot lower them.

// Observed is what the latency policy reads besides the pace.
type Observed interface {
	// RoundTripMs is the round trip to site's gateway, when measured.
	RoundTripMs(site string) (ms float64, ok bool)
	// Waits is the waits observed at site (nil: none).
	Waits(site string) *WaitCurve
	// Costs is what a request's size costs in time.
	Costs() *CostModel
}

// RoundTrip is a smoothed round trip, as a TCP sender keeps its SRTT: each
// sample moves it an eighth of the way. Any goroutine may call it.
type RoundTrip struct {
	bits atomic.Uint64 // float64 bits of the estimate in ms; 0 before any sample
}

// Observe records a round trip of ms.
func (r *RoundTrip) Observe(ms float64) {
	if !(ms >= 0) || math.IsInf(ms, 1) {
		return
	}
	for {
		old := r.bits.Load()
		next := ms
		if old != 0 {
			prev := math.Float64frombits(old)
			next = prev + (ms-prev)/8
		}
		// A round trip of exactly 0 ms is stored as the least positive
		// float, so that 0 still means "no sample".
		nb := math.Float64bits(max(next, math.SmallestNonzeroFloat64))
		if r.bits.CompareAndSwap(old, nb) {
			return
		}
	}
}

// Ms is the estimate, and whether there is one.
func (r *RoundTrip) Ms() (float64, bool) {
	if r == nil {
		return 0, false
	}
	b := r.bits.Load()
	return math.Float64frombits(b), b != 0
}

// WaitCurve is the waits a gateway's requests met at one site, against the
// load the site was predicted at when each was sent (Pick.Load): a curve
// of a few measured points, each the moving mean of the waits of its band
// of loads. It is what the site's answers showed, whatever its board says:
// the latency policy reads a site's predicted wait as at least the curve's
// (a site that claims room while its requests queue is read as slow).
// Any goroutine may call it.
type WaitCurve struct {
	bands [len(waitBandEdges) + 1]waitBand
}

// waitBandEdges are the upper edges of the bands of predicted load (in
// flight over capacity): finer near saturation, where the wait turns.
var waitBandEdges = [...]float64{0.5, 0.75, 0.9, 1, 1.1, 1.25, 1.5, 2}

// waitBand is one band's moving mean wait (float64 bits, ms) and how many
// samples it holds (up to waitWindow).
type waitBand struct {
	mean, n atomic.Uint64
}

// waitWindow is about how many waits a band's mean is over; waitMinSamples
// how many it needs before it is read.
const (
	waitWindow     = 32
	waitMinSamples = 4
)

func waitBandOf(load float64) int {
	for b, edge := range waitBandEdges {
		if load < edge {
			return b
		}
	}
	return len(waitBandEdges)
}

// Observe records a wait of waitMs met by a request sent while the site
// was predicted at load.
func (w *WaitCurve) Observe(load, waitMs float64) {
	if w == nil || math.IsNaN(load) || !(waitMs >= 0) || math.IsInf(waitMs, 1) {
		return
	}
	b := &w.bands[waitBandOf(load)]
	n := min(float64(b.n.Load())+1, waitWindow)
	for {
		old := b.mean.Load()
		m := math.Float64frombits(old)
		if b.mean.CompareAndSwap(old, math.Float64bits(m+(waitMs-m)/n)) {
			break
		}
	}
	if n < waitWindow {
		b.n.Add(1)
	}
}

// AtMs is the wait the curve says a request sent at load meets: the
// highest mean of the bands at or below load's that hold enough samples
// (a wait does not fall as load rises), and whether any does.
func (w *WaitCurve) AtMs(load float64) (ms float64, ok bool) {
	if w == nil || math.IsNaN(load) {
		return 0, false
	}
	for b := range waitBandOf(load) + 1 {
		band := &w.bands[b]
		if band.n.Load() >= waitMinSamples {
			ms, ok = max(ms, math.Float64frombits(band.mean.Load())), true
		}
	}
	return ms, ok
}
