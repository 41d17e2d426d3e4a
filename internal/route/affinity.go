package route

import "math"

// Affinity: a request that carries a session or a prompt prefix prefers the
// site whose engines hold its KV cache (docs/routing.md, affinity). The
// gateway keeps the session table; the snapshot decides whether a bound or
// preferred candidate may take the request now, reading its load as the
// pick does.

// Verdict is what the snapshot says of a bound session's candidate.
type Verdict uint8

// Verdicts.
const (
	// Kept: the request goes to its bound candidate.
	Kept Verdict = iota
	// Gone: the candidate is no longer there, takes nothing (Closed),
	// is unready or demoted, or cannot be reached.
	Gone
	// Saturated: its load read at the pick is at or above the threshold,
	// and another candidate reads below it or the bound one is beyond the
	// bounded-loads slack of the mean (Keep).
	Saturated
)

// PathSession and PathPrefix are the selection paths of affinity.
const (
	PathSession Path = PathAgeAware + 1 + iota
	PathPrefix
)

// Keep decides whether a request for model bound to (site, provider) goes
// there at nowMs: the candidate must serve the model, admit existing
// sessions (NewAndExisting or ExistingOnly), be healthy and reachable, and
// read below threshold — or, when no other candidate reads below it
// either, within the bounded-loads slack of the model's mean load
// (AffinityBalance): a turn that moved would pay its whole prompt's
// prefill at a site that queues too, adding work where there is no room,
// while one that stays queues where its prefix is cached. Shedding is the
// caller's to check first. A kept request counts as one of this gateway's
// own sends, where the policy counts them. It allocates nothing.
func (s *Snapshot) Keep(model, site, provider string, nowMs int64, threshold float64) (Pick, Verdict) {
	m, ok := s.byModel[model]
	if !ok {
		return Pick{}, Gone
	}
	draws := s.draws()
	for _, i := range m.all {
		c := &s.Candidates[i]
		if c.Site != site || c.Provider != provider {
			continue
		}
		if (c.Admission != NewAndExisting && c.Admission != ExistingOnly) || math.IsNaN(c.Score) || c.Upstream == nil {
			return Pick{}, Gone
		}
		board, load := draws.loadAt(s, i, nowMs)
		if load >= threshold {
			mean, roomElsewhere := s.spread(m, i, nowMs, threshold)
			if roomElsewhere || load > (1+AffinityBalance)*mean+1/capacityOr1(c) {
				return Pick{}, Saturated
			}
		}
		draws.sent(s, i, nowMs, board)
		return Pick{Outcome: Routed, Path: PathSession, Candidate: c, Room: hasRoom(c, load), Load: some(load)}, Kept
	}
	return Pick{}, Gone
}

// AffinityBalance is the bounded-loads slack of affinity: a preferred
// candidate takes the request only while its load is at most 1 + this
// times the mean load of the model's candidates (plus one request), so no
// hot prefix drowns a site (Mirrokni, Thorup and Zadimoghaddam, 2018); a
// bound session stays past the threshold, when nowhere has room, only
// within the same slack.
const AffinityBalance = 0.25

// takesNew reports whether affinity may send a new request to c: it admits
// new requests, is healthy and can be reached.
func takesNew(c *Candidate) bool {
	return c.Admission == NewAndExisting && !math.IsNaN(c.Score) && c.Upstream != nil
}

// spread reads the open candidates of one model (takesNew) at nowMs: their
// capacity-weighted mean load, and whether one other than skip reads below
// threshold. It allocates nothing.
func (s *Snapshot) spread(m *modelIndex, skip int32, nowMs int64, threshold float64) (mean float64, roomElsewhere bool) {
	draws := s.draws()
	var sum, weights float64
	for _, i := range m.all {
		c := &s.Candidates[i]
		if !takesNew(c) {
			continue
		}
		_, load := draws.loadAt(s, i, nowMs)
		w := capacityOr1(c)
		sum += load * w
		weights += w
		if i != skip && load < threshold {
			roomElsewhere = true
		}
	}
	if weights == 0 {
		return 0, roomElsewhere
	}
	return sum / weights, roomElsewhere
}

// Prefer maps a prompt prefix's hash to a candidate for model by weighted
// rendezvous hashing (each candidate's draw from the hash and its identity,
// weighted by its ceiling: consistent, since a candidate leaving moves only
// its own prefixes, and proportional to capacity), taking the first in the
// prefix's order that admits new requests, is healthy, reads below
// threshold and within the bounded-loads slack of the mean. It returns
// false when none does: the preference yields to the normal pick. A
// preferred request counts as one of this gateway's own sends. It
// allocates nothing.
func (s *Snapshot) Prefer(model string, hash uint64, nowMs int64, threshold float64) (Pick, bool) {
	m, ok := s.byModel[model]
	if !ok || s.Shedding[model] {
		return Pick{}, false
	}
	draws := s.draws()
	var group [MaxSites]int32
	var boards, loads [MaxSites]float64
	n := 0
	var sum, weights float64
	for _, i := range m.all {
		c := &s.Candidates[i]
		if !takesNew(c) || n == MaxSites {
			continue
		}
		group[n] = i
		boards[n], loads[n] = draws.loadAt(s, i, nowMs)
		w := capacityOr1(c)
		sum += loads[n] * w
		weights += w
		n++
	}
	if n == 0 {
		return Pick{}, false
	}
	mean := sum / weights
	// Unlike Keep, the threshold binds even when no candidate reads below
	// it: every gateway sends a prefix to the same site, and each counts
	// only its own sends, so keeping prefixes past the threshold piles
	// them on one site (measured: BENCHMARKS.md, affinity over three
	// sites).
	best, bestScore := -1, math.Inf(1)
	for k, i := range group[:n] {
		c := &s.Candidates[i]
		w := capacityOr1(c)
		if loads[k] >= threshold || loads[k] > (1+AffinityBalance)*mean+1/w {
			continue
		}
		// Weighted rendezvous: -ln(u)/w is exponential with rate w, so the
		// least over candidates falls on each in proportion to its weight.
		score := -math.Log(unit(hash^identityHash(c), salt0)+0x1p-60) / w
		if score < bestScore {
			best, bestScore = k, score
		}
	}
	if best < 0 {
		return Pick{}, false
	}
	i := group[best]
	c := &s.Candidates[i]
	draws.sent(s, i, nowMs, boards[best])
	return Pick{Outcome: Routed, Path: PathPrefix, Candidate: c, Room: hasRoom(c, loads[best]), Load: some(loads[best])}, true
}

// identityHash is FNV-1a of a candidate's site and provider: its stable
// place in every prefix's rendezvous order.
func identityHash(c *Candidate) uint64 {
	h := uint64(14695981039346656037)
	for _, part := range [...]string{c.Site, "/", c.Provider} {
		for j := 0; j < len(part); j++ {
			h ^= uint64(part[j])
			h *= 1099511628211
		}
	}
	return h
}
