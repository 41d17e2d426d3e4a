package route

import (
	"math"
	"sync"
	"sync/atomic"
)

// Served is what a gateway observed of one remote site's service of one
// model: how many of its requests the site holds now, and how often the
// site's board contradicted what the gateway saw. It is the evidence a
// remote site's claims are read against (docs/routing.md, earned
// capacity): a peer's board is its own word, and a peer with a valid
// certificate can claim any load and any number of idle providers; what
// this gateway sees it serve is not the peer's to say.
//
// The request path writes it (Begin, End); the builder records each
// snapshot's claim (claim) and reads the trust once per snapshot; the
// picks read InFlight. Any goroutine may call it.
type Served struct {
	// inFlight is the number of this gateway's requests the site holds:
	// sent and not yet answered to the end.
	inFlight atomic.Int64
	// claimed is the site's latest claim, as the builder last read it:
	// the instant of its newest reading (ms on the store timeline) above
	// one bit, set when every reading said the site had a free slot and
	// nothing queued.
	claimed atomic.Int64
	mu      sync.Mutex
	// contradicted is the moving share of answers the board contradicted
	// (mu): the request waited more than a unit before its answer began,
	// while a reading taken during that wait said the site had room and
	// no queue. Each answer weighs answerWeight, and the share fades by
	// forgiveHalfLifeMs from atMs, its last change: a site read at its
	// floor is sent next to nothing, and without answers would never
	// show that it mended.
	contradicted float64
	atMs         int64
}

// forgiveHalfLifeMs is how fast a site's contradicted share fades without
// answers.
const forgiveHalfLifeMs = 10_000

// faded is the contradicted share at nowMs; s.mu is held.
func (s *Served) faded(nowMs int64) float64 {
	if s.atMs == 0 || nowMs <= s.atMs {
		return s.contradicted
	}
	return s.contradicted * math.Exp2(-float64(nowMs-s.atMs)/forgiveHalfLifeMs)
}

// answerWeight is the weight of one answer in the moving share: about the
// last twenty.
const answerWeight = 1.0 / 20

// Begin records a request sent to the site.
func (s *Served) Begin() {
	if s != nil {
		s.inFlight.Add(1)
	}
}

// claim records the site's latest readings: the instant of the newest,
// and whether all of them said it had room and nothing queued.
func (s *Served) claim(atMs int64, room bool) {
	v := atMs << 1
	if room {
		v |= 1
	}
	s.claimed.Store(v)
}

// End records the end of a request Begin recorded, at nowMs on the store
// timeline. answered: an answer came back (a request that failed says
// nothing of the board); waitedMs is how long it waited before its answer
// began beyond what the site's unloaded answers take (Service.Waited),
// unitMs the unit a wait is judged in.
func (s *Served) End(answered bool, nowMs int64, waitedMs, unitMs float64) {
	if s == nil {
		return
	}
	s.inFlight.Add(-1)
	if !answered || !(unitMs > 0) || math.IsNaN(waitedMs) {
		return
	}
	// The wait ended by nowMs and began waitedMs before; a reading taken
	// after the request had waited a unit, saying the site had room and
	// nothing queued, is a claim the request disproved. A reading taken
	// earlier may predate the queue the request met.
	c := s.claimed.Load()
	at, room := c>>1, c&1 == 1
	b := 0.0
	if room && waitedMs > unitMs && float64(at) >= float64(nowMs)-waitedMs+unitMs && at <= nowMs {
		b = 1
	}
	s.mu.Lock()
	share := s.faded(nowMs)
	s.contradicted, s.atMs = share+(b-share)*answerWeight, nowMs
	s.mu.Unlock()
}

// InFlight is the number of this gateway's requests the site holds.
func (s *Served) InFlight() float64 {
	if s == nil {
		return 0
	}
	return float64(s.inFlight.Load())
}

// Trust is the share of its claimed capacity the site is read at, at
// nowMs: one while its board agrees with what its answers show, falling
// three times as fast as the share of answers that contradicted it, to a
// floor of minTrust. An honest board is contradicted by next to none of
// its answers; a board that claims room while its queue holds this
// gateway's requests is contradicted by most of them once they wait, and
// a third of them is enough to read it at its floor.
func (s *Served) Trust(nowMs int64) float64 {
	if s == nil {
		return 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(1-distrustGain*s.faded(nowMs), minTrust)
}

// distrustGain is how much faster trust falls than the share of answers
// the site's board contradicted.
const distrustGain = 3

// minTrust is the least share of its claims a site is read at.
const minTrust = 0.05
