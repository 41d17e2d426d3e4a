package route

import (
	"math"
	"sync"
)

// DefaultServiceMs is the unit assumed before any request is observed:
// short for an LLM request, on purpose. A gateway that has seen nothing end
// yet (just started, or restarted into a loaded grid) then reads every
// reading as old and leans on capacity, as a weighted round robin would;
// a longer prior read a second-old board as fresh, underrated the
// arrivals since it, and a rolling restart of three replicas a site sent
// ten requests in a second to the site that read idle (BENCHMARKS.md,
// the restart on real processes).
const DefaultServiceMs = 1_000

// Pace is what the age-aware policy reads a reading's age in: the mean
// duration of a request served without waiting, over all of a gateway's
// requests and, where they can be told apart, per site.
type Pace interface {
	MeanMs() float64
	// SiteMs is site's own mean duration, when it can be told apart.
	SiteMs(site string) (ms float64, ok bool)
	// Served is what this gateway observed of site's service of model:
	// its own requests there and, for a remote site, how its answers bore
	// out its claims (nil: nothing, and its claims are read as they are).
	Served(site, model string) *Served
}

// Service is what a gateway observed of its requests' service, over all
// sites and per site: the age-aware policy's Pace. The request path writes
// it as requests end; a site's estimate is made on its first request and
// dropped with the topology (Retain). Any goroutine may call it.
type Service struct {
	all ServiceTime
	// sites maps a site's name to its estimate: a table, so delivered
	// requests take no gateway-wide lock and allocate nothing; the set of
	// sites is written once per site and read per request.
	sites table[string, ServiceTime]
	// served maps a site and model to what this gateway observed of
	// them, made on its first request, dropped with the topology
	// (Retain).
	served table[servedKey, Served]
	// roundTrips maps a peer site to its round trip and waits a site to
	// its waits, each made on first use and dropped with the topology
	// (Retain); costs is what a request's size costs. The latency
	// policy's Observed.
	roundTrips table[string, RoundTrip]
	waits      table[string, WaitCurve]
	costs      CostModel
}

// RoundTrip is the round trip to site's gateway, made on first use: the
// gateway's probes of its peers write it.
func (s *Service) RoundTrip(site string) *RoundTrip {
	return s.roundTrips.get(site)
}

// RoundTripMs is the round trip to site's gateway, when measured.
func (s *Service) RoundTripMs(site string) (float64, bool) {
	v, ok := s.roundTrips.lookup(site)
	if !ok {
		return 0, false
	}
	return v.Ms()
}

// AtSiteMs is how long a stream from site was at the site before its
// first token: its time to first token less the round trip to the site's
// gateway, when one is measured (this site's own providers have none).
func (s *Service) AtSiteMs(site string, firstTokenMs float64) float64 {
	if rtt, ok := s.RoundTripMs(site); ok {
		return max(firstTokenMs-rtt, 0)
	}
	return firstTokenMs
}

// Waits is the waits observed at site, made on first use.
func (s *Service) Waits(site string) *WaitCurve { return s.waits.get(site) }

// Costs is what a request's size costs in time, learned from streams.
func (s *Service) Costs() *CostModel { return &s.costs }

// servedKey names one site's service of one model.
type servedKey struct{ site, model string }

// Served is site's observed service of model, made on first use.
func (s *Service) Served(site, model string) *Served {
	return s.served.get(servedKey{site, model})
}

// Waited is when an answer from site, sent at sentMs on the store
// timeline, its first byte firstTokenMs later and its end totalMs later
// (a stream is judged at its first byte, when its end is not known: it
// passes its first byte's), of cost c, certainly waited in the site's
// queue: what Served.Judge judges the site's claims by.
//
// A stream's wait is its time at the site before its first token beyond
// what a request of its size takes there without one (CostModel.WaitMs;
// before the model knows that, beyond the least of the site's recent
// streams). It waited from when it reached the site, no later than its
// send plus the site's least time to first token (which holds the whole
// round trip), until no earlier than its send plus the wait: between the
// two it was certainly queued. A wait under a quarter of the unit, or
// under the round trip to the peer, is not judged: prefill and batching
// vary by the one without a queue, a path's delay by the other.
//
// A whole answer shows a queue far less surely than a stream's first
// token: its own length varies with what it was asked, and only a wait
// beyond twice the site's unit is evidence, judged against a reading taken
// after it had waited a unit (the queue it met may have been after an
// earlier one). Until a peer's own pace can be told apart its unit is
// that of all answers, mostly this site's, which holds no round trip: the
// round trip to the peer is then taken off the duration too, or every
// short answer from a distant honest peer would read as a wait.
func (s *Service) Waited(site string, stream bool, sentMs, firstTokenMs, totalMs float64, c Cost) Wait {
	unitMs := s.MeanMs()
	own := false
	if v, ok := s.SiteMs(site); ok && v > 0 {
		unitMs, own = v, true
	}
	rtt, rttOK := s.RoundTripMs(site)
	if !stream {
		end := sentMs + totalMs
		if rttOK && !own {
			totalMs -= rtt
		}
		waited := totalMs - 2*unitMs
		if !(waited > unitMs) {
			return Wait{}
		}
		return Wait{FromMs: end - waited + unitMs, ToMs: end}
	}
	least := s.site(site).leastFirstToken()
	if math.IsInf(least, 1) {
		least = firstTokenMs
	}
	waited := firstTokenMs - least
	if w, ok := s.costs.WaitMs(c, s.AtSiteMs(site, firstTokenMs)); ok {
		waited = w
	}
	if !(waited > max(unitMs*judgedStreamWait, rtt)) {
		return Wait{}
	}
	return Wait{FromMs: sentMs + least, ToMs: sentMs + waited}
}

// judgedStreamWait is the least wait, in units, a stream's answer is
// judged by.
const judgedStreamWait = 0.25

// Observe records a whole answer from site (ServiceTime.Observe).
func (s *Service) Observe(site string, ms float64, room bool) {
	s.all.Observe(ms, room)
	s.site(site).Observe(ms, room)
}

// ObserveStream records a stream from site (ServiceTime.ObserveStream).
func (s *Service) ObserveStream(site string, firstTokenMs, decodeMs float64) {
	s.all.ObserveStream(firstTokenMs, decodeMs)
	s.site(site).ObserveStream(firstTokenMs, decodeMs)
}

// MeanMs is the estimate over all sites.
func (s *Service) MeanMs() float64 { return s.all.MeanMs() }

// SiteMs is site's own pace when it can be told apart (SitePace).
func (s *Service) SiteMs(site string) (float64, bool) {
	st, ok := s.sites.lookup(site)
	if !ok {
		return 0, false
	}
	return SitePace(&s.all, st)
}

// Retain drops the estimates of sites live does not keep.
func (s *Service) Retain(live func(site string) bool) {
	s.served.retain(func(k servedKey) bool { return live(k.site) })
	s.sites.retain(live)
	s.roundTrips.retain(live)
	s.waits.retain(live)
}

// site is site's estimate, made on first use.
func (s *Service) site(site string) *ServiceTime { return s.sites.get(site) }

// ServiceTime estimates the mean duration of a request served without
// waiting: the unit in which the age-aware policy reads a reading's age
// (Pace). Durations that include a queue would feed on
// herding: once requests wait, durations grow, readings look younger than
// they are, and the policy trusts them harder (measured in
// internal/routesim, phases sync). The queue is kept out three ways:
//
//   - a stream teaches its time after the first token (decode, which
//     follows any wait) plus the least time to first token of the recent
//     streams (the prefill a request that did not wait needs, as a TCP
//     sender takes the least round trip for the path's own delay);
//   - a whole answer teaches its duration only when the pick saw a free
//     slot for it (Pick.Room);
//   - the estimate is the least of the means of the last serviceWindows
//     windows of serviceWindow such samples: a herd that sets in lengthens
//     the windows it fills, not the ones before it. A real change in
//     request length is learned once the windows before it have aged out
//     (serviceWindows × serviceWindow requests). Erring low is the safe
//     side: readings then look older, and the policy leans on capacity.
//
// It starts at DefaultServiceMs; until the first window fills it
// is the mean of what it has seen. Any goroutine may call it.
type ServiceTime struct {
	mu      sync.Mutex
	sum     float64 // of the window being filled, ms
	count   int
	windows [serviceWindows]float64 // full windows' means, ms; 0 = not yet
	// pace and paceSq sum the window's paces (a stream's decode, a whole
	// answer's duration: no first-token term, which a herd from the start
	// lengthens) and their squares; paces and paceSquares are the full
	// windows' means of them (SitePace).
	pace, paceSq       float64
	paces, paceSquares [serviceWindows]float64
	next               int // the slot the next full window takes
	// firstToken is the least time to first token of the window being
	// filled, lastFirstToken of the window before it; +Inf when none.
	// Both are unused until streamed is set by the first stream.
	firstToken, lastFirstToken float64
	streamed                   bool
}

// The estimate is the least of the means of serviceWindows windows of
// serviceWindow samples (docs/routing.md, constants).
const (
	serviceWindow  = 100
	serviceWindows = 8
)

// paceStdErrors is how many standard errors of a site's mean pace it must
// stand from all requests' before the site is read in a unit of its own
// (SitePace).
const paceStdErrors = 4

// Observe records a whole answer's duration; one sent without room teaches
// nothing.
func (s *ServiceTime) Observe(ms float64, room bool) {
	if !room || !(ms > 0) || math.IsInf(ms, 1) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(ms, ms)
}

// ObserveStream records a stream that took firstTokenMs to its first token
// and decodeMs after it.
func (s *ServiceTime) ObserveStream(firstTokenMs, decodeMs float64) {
	if !(firstTokenMs >= 0) || !(decodeMs >= 0) || math.IsInf(firstTokenMs+decodeMs, 1) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.streamed {
		s.streamed = true
		s.firstToken, s.lastFirstToken = math.Inf(1), math.Inf(1)
	}
	s.firstToken = math.Min(s.firstToken, firstTokenMs)
	if ms := decodeMs + math.Min(s.firstToken, s.lastFirstToken); ms > 0 {
		s.add(ms, decodeMs)
	}
}

// add records one sample and its pace; s.mu is held.
func (s *ServiceTime) add(ms, pace float64) {
	s.sum += ms
	s.pace += pace
	s.paceSq += pace * pace
	s.count++
	if s.count == serviceWindow {
		s.windows[s.next] = s.sum / serviceWindow
		s.paces[s.next], s.paceSquares[s.next] = s.pace/serviceWindow, s.paceSq/serviceWindow
		s.next = (s.next + 1) % serviceWindows
		s.sum, s.pace, s.paceSq, s.count = 0, 0, 0, 0
		if s.streamed {
			s.firstToken, s.lastFirstToken = math.Inf(1), s.firstToken
		}
	}
}

// leastFirstToken is the least time to first token of the recent
// streams (this window's and the last), +Inf before any.
func (s *ServiceTime) leastFirstToken() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.streamed {
		return math.Inf(1)
	}
	return math.Min(s.firstToken, s.lastFirstToken)
}

// MeanMs is the estimate.
func (s *ServiceTime) MeanMs() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	least := math.Inf(1)
	for _, w := range s.windows {
		if w > 0 {
			least = math.Min(least, w)
		}
	}
	switch {
	case !math.IsInf(least, 1):
		return least
	case s.count > 0:
		return s.sum / float64(s.count)
	}
	return DefaultServiceMs
}

// paceStats is the mean pace of the samples in the full windows and its
// standard error, over n full windows.
func (s *ServiceTime) paceStats() (mean, stdErr float64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum, sq float64
	for k, w := range s.windows {
		if w > 0 {
			sum += s.paces[k]
			sq += s.paceSquares[k]
			n++
		}
	}
	if n == 0 {
		return 0, 0, 0
	}
	mean, sq = sum/float64(n), sq/float64(n)
	return mean, math.Sqrt(max(sq-mean*mean, 0) / float64(n*serviceWindow)), n
}

// SitePace is one site's own mean duration (Pace.SiteMs) when its
// requests can be told apart from all of this gateway's requests (all):
// once site has a full window, and their mean paces (a stream's decode, a
// whole answer's duration) differ by more than four standard errors of the
// site's. It is all's estimate scaled by the ratio of the two paces, so the
// site's unit keeps all's guard against a herd, and a herd from the start,
// which lengthens every first token of a window, does not reach it.
// Otherwise ok is false and the site is read in all's unit: a site's own
// estimate from a gateway's share of its requests is noisy (a window of 100
// exponential durations has a standard error of a tenth of their mean), and
// at load 0.9 a site whose pace reads 5% fast is sent 5% more than it
// completes (internal/routesim, sites 8/8/16/32/64).
func SitePace(all, site *ServiceTime) (ms float64, ok bool) {
	m, se, n := site.paceStats()
	if n == 0 {
		return 0, false
	}
	ref, _, nAll := all.paceStats()
	if nAll == 0 || math.Abs(m-ref) <= paceStdErrors*se {
		return 0, false
	}
	return all.MeanMs() * m / ref, true
}
