package route

import (
	"math"

	"github.com/grid-inference/grid/internal/loadstore"
)

// Reference is the reference system's policy (docs/protocol.md §4.12): the
// candidates with room (smoothed rho below 1) by two weighted choices, the
// better of two by service rate, or the lone one; without room, by
// capacity among the least queued. It reads each candidate's rho as of its
// latest reading, whatever its age, and keeps no state of its own.
type Reference struct{}

// Name is "reference".
func (Reference) Name() string { return PolicyReference }

func (Reference) prepare(*Snapshot, int64) picker { return referencePicker{} }
func (Reference) forget([]loadstore.Key)          {}

// referencePicker draws by the reference arms; it holds nothing.
type referencePicker struct{}

// The reference's split between two sites with room: each takes its share
// of their service rates, but never less than minTwoShare.
const minTwoShare = 0.1

func (referencePicker) pick(s *Snapshot, healthy []int32, _ Cost, turn uint64, _ int64) Pick {
	var room [MaxSites]int32
	nr := 0
	for _, i := range healthy {
		if c := &s.Candidates[i]; c.Measured && c.Rho < 1 {
			room[nr] = i
			nr++
		}
	}
	u0, u1 := unit(turn, salt0), unit(turn, salt1)
	capacity := func(i int32) float64 { return capacityOr1(&s.Candidates[i]) }
	switch {
	case nr >= 3:
		first := s.weighted(room[:nr], -1, u0, capacity)
		second := s.weighted(room[:nr], first, u1, capacity)
		if second < 0 {
			second = first
		}
		pick := room[first]
		if s.Candidates[room[second]].Rho < s.Candidates[pick].Rho {
			pick = room[second]
		}
		return Pick{Outcome: Routed, Path: PathTwoChoices, Candidate: &s.Candidates[pick], Room: true}
	case nr == 2:
		a, b := &s.Candidates[room[0]], &s.Candidates[room[1]]
		ra, rb := rate(a), rate(b)
		share := min(1-minTwoShare, max(minTwoShare, ra/(ra+rb)))
		if u0 < share {
			return Pick{Outcome: Routed, Path: PathBetweenTwo, Candidate: a, Room: true}
		}
		return Pick{Outcome: Routed, Path: PathBetweenTwo, Candidate: b, Room: true}
	case nr == 1:
		return Pick{Outcome: Routed, Path: PathLone, Candidate: &s.Candidates[room[0]], Room: true}
	}
	return Pick{Outcome: Routed, Path: PathByCapacity, Candidate: &s.Candidates[s.byCapacity(healthy, u0)]}
}

// loadAt is the candidate's raw saturation: the reference reads no age and
// counts no sends. Unmeasured, it reads 0.
func (referencePicker) loadAt(s *Snapshot, i int32, _ int64) (board, load float64) {
	if c := &s.Candidates[i]; c.Measured {
		return c.RawRho, c.RawRho
	}
	return 0, 0
}

func (referencePicker) sent(*Snapshot, int32, int64, float64) {}
func (p referencePicker) restrict(*Snapshot, []int32) picker  { return p }

func capacityOr1(c *Candidate) float64 {
	if c.Measured {
		return c.Capacity
	}
	return 1
}

func rate(c *Candidate) float64 {
	rho := 0.0
	if c.Measured {
		rho = c.Rho
	}
	return capacityOr1(c) / (1 + rho)
}

// byCapacity picks among healthy sites when none has room: those not full
// (or all), the band with the best score, weighted by capacity.
func (s *Snapshot) byCapacity(healthy []int32, u float64) int32 {
	var pool [MaxSites]int32
	np := 0
	for _, i := range healthy {
		if s.Candidates[i].Full != Yes {
			pool[np] = i
			np++
		}
	}
	if np == 0 {
		np = copy(pool[:], healthy)
	}
	best := s.Candidates[pool[0]].Score
	for _, i := range pool[1:np] {
		if less(s.Candidates[i].Score, best) {
			best = s.Candidates[i].Score
		}
	}
	var band [MaxSites]int32
	nb := 0
	sum, measured := 0.0, 0
	for _, i := range pool[:np] {
		sc := s.Candidates[i].Score
		if sc == best || (math.IsNaN(sc) && math.IsNaN(best)) {
			band[nb] = i
			nb++
			if c := &s.Candidates[i]; c.Measured {
				sum += c.Capacity
				measured++
			}
		}
	}
	fill := 1.0
	if measured > 0 {
		fill = sum / float64(measured)
	}
	return band[s.weighted(band[:nb], -1, u, func(i int32) float64 {
		if c := &s.Candidates[i]; c.Measured {
			return c.Capacity
		}
		return fill
	})]
}
