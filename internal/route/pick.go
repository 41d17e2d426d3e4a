package route

import "math"

// MaxSites bounds the healthy matches one request weighs.
const MaxSites = 64

// Outcome is what a pick decided.
type Outcome uint8

// Outcomes. Routed and Fallback carry a candidate; the rest are refusals.
const (
	Routed Outcome = iota
	// Fallback: no healthy match; the first admitted one is used.
	Fallback
	// Shed: every site serving the model is full (429).
	Shed
	// NotReady: candidates exist but none is admitted (503).
	NotReady
	// UnknownModel: no candidate serves the model (404 model_not_found).
	UnknownModel
	// NoRoute: admitted candidates exist but none can be reached, or the
	// snapshot holds no candidates at all (404 no_route).
	NoRoute
)

// Path is the selection path taken, the label of
// grid_route_selections_total.
type Path uint8

// Paths.
const (
	PathNone Path = iota
	PathTwoChoices
	PathBetweenTwo
	PathLone
	PathByCapacity
	// PathAgeAware: drawn from the active set of the age-aware policy.
	PathAgeAware
)

func (p Path) String() string {
	return [...]string{"", "two_choices", "between_two", "lone", "by_capacity", "age_aware", "session", "prefix"}[p]
}

// Pick is a decision.
type Pick struct {
	Outcome   Outcome
	Path      Path
	Candidate *Candidate
	// Room: the pick saw a free slot for this request at the candidate
	// (under the age-aware policy, its predicted in-flight with this
	// gateway's own sends below its ceiling; under the reference, a site
	// with room). Only such requests teach ServiceTime.
	Room bool
}

// Salts of the two independent draws.
const (
	salt0 = 0x9E3779B97F4A7C15
	salt1 = 0xC2B2AE3D27D4EB4F
)

// unit maps a request turn and a salt to [0, 1) with the SplitMix64
// finaliser, so draws are uniform, independent and allocation-free.
func unit(turn, salt uint64) float64 {
	x := turn ^ salt
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// Pick selects a candidate for model (docs/protocol.md §4.12) at nowMs on the
// store timeline. It reads the snapshot, which it never writes; under the
// age-aware policy it also reads and counts this gateway's own sends in own
// (nil: the board alone), decayed by nowMs. It allocates nothing.
func (s *Snapshot) Pick(model string, turn uint64, nowMs int64, own *OwnSends) Pick {
	if len(s.Candidates) == 0 {
		return Pick{Outcome: NoRoute}
	}
	if s.Shedding[model] {
		return Pick{Outcome: Shed}
	}
	idx, ok := s.byModel[model]
	if !ok {
		return Pick{Outcome: UnknownModel}
	}
	var matches, healthy [MaxSites]int32
	nm, nh, admitted := 0, 0, false
	for _, i := range idx {
		c := &s.Candidates[i]
		if c.Admission != NewAndExisting {
			continue
		}
		admitted = true
		if c.Upstream == nil {
			continue
		}
		if nm < MaxSites {
			matches[nm] = i
			nm++
		}
		if nh < MaxSites && !math.IsNaN(c.Score) {
			healthy[nh] = i
			nh++
		}
	}
	switch {
	case nm == 0 && admitted:
		return Pick{Outcome: NoRoute}
	case nm == 0:
		return Pick{Outcome: NotReady}
	case nh == 0:
		return Pick{Outcome: Fallback, Candidate: &s.Candidates[matches[0]]}
	}
	var room [MaxSites]int32
	nr := 0
	for _, i := range healthy[:nh] {
		if c := &s.Candidates[i]; c.Measured && c.Rho < 1 {
			room[nr] = i
			nr++
		}
	}
	u0, u1 := unit(turn, salt0), unit(turn, salt1)
	if s.ageAware {
		// Read every healthy site's load through its age. The active set
		// is the guarantee: a site predicted above the common level is not
		// drawn while one below it exists. A "full" flag is not consulted:
		// it latches over the settling window, and excluding on it herds
		// (measured in internal/routesim).
		if i, room := s.pickAgeAware(healthy[:nh], weyl(turn), nowMs, own.countersFor(s)); i >= 0 {
			return Pick{Outcome: Routed, Path: PathAgeAware, Candidate: &s.Candidates[i], Room: room}
		}
	}
	switch {
	case nr >= 3:
		first := s.weighted(room[:nr], -1, u0, capacityOr1)
		second := s.weighted(room[:nr], first, u1, capacityOr1)
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
		share := min(0.9, max(0.1, ra/(ra+rb)))
		if u0 < share {
			return Pick{Outcome: Routed, Path: PathBetweenTwo, Candidate: a, Room: true}
		}
		return Pick{Outcome: Routed, Path: PathBetweenTwo, Candidate: b, Room: true}
	case nr == 1:
		return Pick{Outcome: Routed, Path: PathLone, Candidate: &s.Candidates[room[0]], Room: true}
	}
	return Pick{Outcome: Routed, Path: PathByCapacity, Candidate: &s.Candidates[s.byCapacity(healthy[:nh], u0)]}
}

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

// weighted draws a position of list by weight, skipping position skip (-1:
// none): walk the list subtracting weights from u × total until it goes
// negative. It returns -1 when nothing is left to draw.
func (s *Snapshot) weighted(list []int32, skip int, u float64, w func(*Candidate) float64) int {
	total := 0.0
	for k, i := range list {
		if k != skip {
			total += w(&s.Candidates[i])
		}
	}
	target := u * total
	last := -1
	for k, i := range list {
		if k == skip {
			continue
		}
		last = k
		if target -= w(&s.Candidates[i]); target < 0 {
			return k
		}
	}
	return last
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
	return band[s.weighted(band[:nb], -1, u, func(c *Candidate) float64 {
		if c.Measured {
			return c.Capacity
		}
		return fill
	})]
}

// weyl maps a request turn to [0, 1) along the golden-ratio sequence:
// consecutive turns fall evenly apart, so draws by weight over a run of
// requests follow the weights closely (as a weighted round robin would),
// and gateways starting at unrelated turns do not move in step.
func weyl(turn uint64) float64 {
	return float64(turn*0x9E3779B97F4A7C15>>11) / (1 << 53)
}
