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
// snapshot's claim (claim), reads the trust once per snapshot and what the
// site held at its reading (heldAt); the picks read InFlight. Any
// goroutine may call it. A gateway keeps one for its own site too, which
// only counts: its board is this gateway's operator's, not a peer's word
// to judge.
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
	// held is inFlight's recent history, for what the site held at a
	// reading's instant (heldAt): entry s%heldSlots holds, for the last
	// slot s of heldSlotMs on the store timeline in which inFlight
	// changed, s and inFlight after that slot's last change (packHeld).
	// Written by Begin and End, lock-free.
	held [heldSlots]atomic.Uint64
}

// heldSlotMs and heldSlots shape Served.held: a history of 12.8 s in
// steps of 100 ms. A reading arrives a poll or two after it was taken, a
// remote one about a second; one older than the history is read against
// the count nearest it.
const (
	heldSlotMs = 100
	heldSlots  = 128
)

// packHeld packs a slot (40 bits, one more than the slot, so that the
// zero word is no slot's) and a count (24 bits) into one word.
func packHeld(slot, count int64) uint64 {
	return uint64(slot+1)<<24 | uint64(min(max(count, 0), 1<<24-1))
}

func unpackHeld(w uint64) (slot, count int64) { return int64(w>>24) - 1, int64(w & (1<<24 - 1)) }

// record writes inFlight into the history at nowMs. A writer whose count
// another overtook before it stored writes again, so the last word
// stored in a slot is the count after the slot's last change.
func (s *Served) record(nowMs int64) {
	slot := max(nowMs, 0) / heldSlotMs
	e := &s.held[slot%heldSlots]
	for {
		v := s.inFlight.Load()
		e.Store(packHeld(slot, v))
		if s.inFlight.Load() == v {
			return
		}
	}
}

// heldAt returns how many of this gateway's requests the site held at
// atMs on the store timeline, to the history's 100 ms: the count after
// the last change at or before atMs. With no change recorded in the
// history before atMs, it is the count after the first change since
// (one off at most), or, with none since either, the count now.
func (s *Served) heldAt(atMs int64) float64 {
	if s == nil {
		return 0
	}
	at := atMs / heldSlotMs
back:
	for j := at; j > at-heldSlots && j >= 0; j-- {
		switch slot, count := unpackHeld(s.held[j%heldSlots].Load()); {
		case slot == j:
			return float64(count)
		case slot > j:
			break back // written over by a newer slot: the history ends
		}
	}
	for j := max(at+1, 0); j <= at+heldSlots; j++ {
		if slot, count := unpackHeld(s.held[j%heldSlots].Load()); slot == j {
			return float64(count)
		}
	}
	return float64(s.inFlight.Load())
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

// Begin records a request sent to the site at nowMs on the store
// timeline.
func (s *Served) Begin(nowMs int64) {
	if s != nil {
		s.inFlight.Add(1)
		s.record(nowMs)
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

// End records the end at nowMs of a request Begin recorded, answered or
// not.
func (s *Served) End(nowMs int64) {
	if s != nil {
		s.inFlight.Add(-1)
		s.record(nowMs)
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
