package route

import (
	"math"
	"sync"
)

// Cost is what a request will cost an engine, estimated from its body
// without a tokenizer (docs/gateway.md, request cost). A zero field is
// unknown: the request is read as a mean one.
type Cost struct {
	// Prompt is the prompt tokens it must prefill.
	Prompt int
	// MaxOutput is its own limit on what it generates.
	MaxOutput int
}

// CostModel learns, from the streams a gateway sees end, what a request's
// size costs in time: how long a prompt token takes to prefill (the slope
// of the time to first token over the prompt, among requests whose pick
// saw a free slot, so that a queue does not pass for prefill), the time to
// first token of an empty prompt, and how long the decode takes per token
// of the request's output limit (requests that set none are read at the
// mean decode of those that did not either). A request's work is their
// sum: the time it holds an engine's slot. The latency policy weighs this
// gateway's own sends by their work over the mean work, and adds a
// request's prefill to each site's predicted time to first token.
//
// Every estimate is an exponentially weighted mean over about the last
// costWindow samples, so a change of traffic is learned within a few
// hundred requests. Any goroutine may call it.
type CostModel struct {
	mu sync.Mutex
	// n counts the samples of the prefill regression (saturating at
	// costWindow); the means are of prompt x, first token y, x², x·y.
	n                  float64
	mx, my, mxx, mxy   float64
	perMaxToken, nTok  float64 // decode ms per token of MaxOutput, and its count
	plainDecode, nNone float64 // decode ms of requests without MaxOutput, and its count
	// meanPrompt and meanDecode are every observed request's, and nAll
	// their count: the mean request the weights are relative to.
	meanPrompt, meanDecode, nAll float64
}

// costWindow is about how many samples each estimate averages over.
const costWindow = 256

// costMinSamples is how many samples an estimate needs before it is used.
const costMinSamples = 16

// ewma folds v into the mean m of about min(n, costWindow) samples and
// returns both, n counting up to costWindow.
func ewma(m, n, v float64) (float64, float64) {
	n = min(n+1, costWindow)
	return m + (v-m)/n, n
}

// Observe records a stream of c that took firstTokenMs to its first token
// and decodeMs after it; room is whether its pick saw a free slot.
func (m *CostModel) Observe(c Cost, firstTokenMs, decodeMs float64, room bool) {
	if !(firstTokenMs >= 0) || !(decodeMs >= 0) || math.IsInf(firstTokenMs+decodeMs, 0) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if room {
		x, y := float64(c.Prompt), firstTokenMs
		n := min(m.n+1, costWindow)
		m.mx += (x - m.mx) / n
		m.my += (y - m.my) / n
		m.mxx += (x*x - m.mxx) / n
		m.mxy += (x*y - m.mxy) / n
		m.n = n
	}
	if c.MaxOutput > 0 {
		m.perMaxToken, m.nTok = ewma(m.perMaxToken, m.nTok, decodeMs/float64(c.MaxOutput))
	} else {
		m.plainDecode, m.nNone = ewma(m.plainDecode, m.nNone, decodeMs)
	}
	n := m.nAll
	m.meanPrompt, _ = ewma(m.meanPrompt, n, float64(c.Prompt))
	m.meanDecode, m.nAll = ewma(m.meanDecode, n, decodeMs)
}

// CostRates are a CostModel's estimates at one moment: what a pick reads,
// without the model's lock (the latency policy takes them once per
// snapshot). The zero value knows nothing: every request weighs 1.
type CostRates struct {
	// perToken is the prefill of a prompt token, base the time to first
	// token of an empty prompt (ms), known once prefillOK.
	perToken, base float64
	prefillOK      bool
	// perMaxToken is the decode per token of a request's output limit,
	// plainDecode the decode of a request that sets none (ms), each known
	// once its ok is set; mean is the mean request's work (ms).
	perMaxToken, plainDecode float64
	maxTokenOK, plainOK      bool
	mean                     float64
}

// Rates are the model's estimates now.
func (m *CostModel) Rates() CostRates {
	if m == nil {
		return CostRates{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var r CostRates
	if m.n >= costMinSamples {
		if v := m.mxx - m.mx*m.mx; v > 0 {
			r.perToken = max((m.mxy-m.mx*m.my)/v, 0)
		}
		r.base, r.prefillOK = max(m.my-r.perToken*m.mx, 0), true
	}
	r.perMaxToken, r.maxTokenOK = m.perMaxToken, m.nTok >= costMinSamples
	r.plainDecode, r.plainOK = m.plainDecode, m.nNone >= costMinSamples
	if r.prefillOK && m.nAll >= costMinSamples {
		r.mean = r.base + r.perToken*m.meanPrompt + m.meanDecode
	}
	return r
}

// FirstTokenMs is the time to first token of c without a wait (an empty
// prompt's, plus c's prefill), and whether the model knows it yet.
func (m *CostModel) FirstTokenMs(c Cost) (float64, bool) {
	r := m.Rates()
	return r.FirstTokenMs(c)
}

// WaitMs is how long a stream of c waited at its site before its first
// token, atSiteMs after it reached the site (its time to first token less
// the round trip to a peer's gateway): less what a request of its size
// takes without a wait (FirstTokenMs). It is what a WaitCurve learns, and
// there is none (ok false) until the model knows that time: measured from
// the least of a few first tokens instead, every wait read high by the
// jitter of the others, and a site with waits observed lost its requests
// to a peer with none (the round trip was crossed for 10 to 12 of 60
// requests to a site with room).
func (m *CostModel) WaitMs(c Cost, atSiteMs float64) (waitedMs float64, ok bool) {
	base, ok := m.FirstTokenMs(c)
	if !ok {
		return 0, false
	}
	return max(atSiteMs-base, 0), true
}

// PrefillMs is how long c's prompt takes to prefill beyond an empty one's,
// 0 while unknown.
func (m *CostModel) PrefillMs(c Cost) float64 {
	r := m.Rates()
	return r.PrefillMs(c)
}

// Weight is c's work over the mean request's (CostRates.Weight).
func (m *CostModel) Weight(c Cost) float64 {
	r := m.Rates()
	return r.Weight(c)
}

// FirstTokenMs is the time to first token of c without a wait, and
// whether it is known.
func (r *CostRates) FirstTokenMs(c Cost) (float64, bool) {
	return r.base + r.perToken*float64(max(c.Prompt, 0)), r.prefillOK
}

// PrefillMs is how long c's prompt takes to prefill beyond an empty one's,
// 0 while unknown.
func (r *CostRates) PrefillMs(c Cost) float64 {
	return r.perToken * float64(max(c.Prompt, 0))
}

// Weight is c's work over the mean work of the requests observed: what one
// send of c adds to a site's load, in mean requests. It is 1 until the
// model has seen enough, and for a request of unknown size.
func (r *CostRates) Weight(c Cost) float64 {
	if (c.Prompt <= 0 && c.MaxOutput <= 0) || !(r.mean > 0) {
		return 1
	}
	work := r.base + r.perToken*float64(max(c.Prompt, 0))
	switch {
	case c.MaxOutput > 0 && r.maxTokenOK:
		work += r.perMaxToken * float64(c.MaxOutput)
	case c.MaxOutput <= 0 && r.plainOK:
		work += r.plainDecode
	default:
		return 1
	}
	// A weight is bounded: one request's estimate is not allowed to read
	// a site as empty, or as full, by itself.
	return min(max(work/r.mean, minWeight), maxWeight)
}

// The bounds of a request's weight.
const (
	minWeight = 0.05
	maxWeight = 20
)
