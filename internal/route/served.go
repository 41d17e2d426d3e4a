package route

import (
	"math"
	"sync"
	"sync/atomic"
)

// Served is what a gateway observed of one site's service of one model:
// how many of its requests the site holds now, and, for a remote site,
// how often the site's board contradicted what the gateway saw. It is the
// evidence a remote site's claims are read against (docs/routing.md,
// earned capacity): a peer's board is its own word, and a peer with a
// valid certificate can claim any load and any number of idle providers;
// what this gateway sees it serve is not the peer's to say.
//
// The request path writes it (Begin, Judge, End); the builder records each
// snapshot's claim (claim), reads the trust once per snapshot and, under
// AgeAwareOptions.OwnCount, what the site held at its reading (heldAt);
// the picks read InFlight. Any goroutine may call it.
type Served struct {
	// inFlight is the number of this gateway's requests the site holds:
	// sent and not yet answered to the end.
	inFlight atomic.Int64
	mu       sync.Mutex
	// claims are the site's latest distinct claims (mu), as the builder
	// read them, oldest first from next: a request's wait spans several
	// readings, and ended before it is judged.
	claims [claimHistory]boardClaim
	next   int
	// contradicted is the moving share of answers the board contradicted
	// (mu): a reading taken while the request certainly waited in the
	// site's queue (Wait) said the site had room and no queue. Each
	// answer weighs answerWeight, and the share fades by
	// forgiveHalfLifeMs from atMs, its last change: a site read at its
	// floor is sent next to nothing, and without answers would never
	// show that it mended.
	contradicted float64
	atMs         int64
	// readingAt is the instant of the site's newest reading the builder
	// read, and heldAtReading how many of this gateway's requests the site
	// held when the builder first read it (mu): the nearest this gateway
	// knows of what the reading counted of its own.
	readingAt, heldAtReading int64
}

// heldAt returns how many of this gateway's requests the site held
// when the builder first read its newest reading, at readingAt.
func (s *Served) heldAt(readingAt int64) float64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if readingAt != s.readingAt {
		s.readingAt, s.heldAtReading = readingAt, s.inFlight.Load()
	}
	return float64(s.heldAtReading)
}

// boardClaim is what the site's readings of the model said at one instant (ms
// on the store timeline; 0: none): whether all of them said it had a free
// slot and nothing queued.
type boardClaim struct {
	atMs int64
	room bool
}

// claimHistory is how many distinct claims a site's observed service
// keeps: at the default one-second poll, the readings of the last 16 s. A
// stream is judged at its first byte, as its wait ends; a whole answer at
// its end, and one whose wait ended before them is not judged.
const claimHistory = 16

// Wait is the stretch of time, on the store timeline, in which a request
// certainly waited in its site's queue (Service.Waited): a reading taken
// within it that said the site had room and nothing queued is one its
// answer disproves. A Wait that does not end after it begins (the zero
// Wait) holds nothing: the answer shows no wait worth judging.
type Wait struct{ FromMs, ToMs float64 }

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
// and whether all of them said it had room and nothing queued. A build
// that read no newer reading claims nothing new.
func (s *Served) claim(atMs int64, room bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := &s.claims[(s.next+claimHistory-1)%claimHistory]
	if last.atMs == atMs {
		last.room = room
		return
	}
	s.claims[s.next] = boardClaim{atMs: atMs, room: room}
	s.next = (s.next + 1) % claimHistory
}

// End records the end of a request Begin recorded, answered or not.
func (s *Served) End() {
	if s != nil {
		s.inFlight.Add(-1)
	}
}

// Judge records what an answer showed of the site's board, at nowMs on
// the store timeline: w is when it certainly waited in the site's queue
// (Service.Waited), and a claim of room taken then contradicts the board.
// A stream is judged at its first byte, a whole answer at its end, each
// once; a request that got no answer says nothing of the board.
func (s *Served) Judge(nowMs int64, w Wait) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := 0.0
	if w.FromMs < w.ToMs {
		for _, c := range s.claims {
			if c.room && c.atMs != 0 && float64(c.atMs) >= w.FromMs && float64(c.atMs) <= w.ToMs {
				b = 1
				break
			}
		}
	}
	share := s.faded(nowMs)
	s.contradicted, s.atMs = share+(b-share)*answerWeight, nowMs
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
