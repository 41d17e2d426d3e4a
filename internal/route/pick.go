package route

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

// The paths of affinity (affinity.go) follow PathAgeAware; those of the
// latency policy (latency.go) them, and the age-aware own count's
// (PathOwnCount) theirs.

func (p Path) String() string {
	return [...]string{"", "two_choices", "between_two", "lone", "by_capacity", "age_aware", "session", "prefix", "stay_local", "latency", "own_count"}[p]
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
	// Load is the candidate's site's predicted load (in flight over
	// capacity) as the pick read it, absent where the policy predicts
	// none: what the wait its request meets is observed against
	// (WaitCurve).
	Load Opt
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

// Pick selects a candidate for a request of model of unknown size
// (PickSized).
func (s *Snapshot) Pick(model string, turn uint64, nowMs int64) Pick {
	return s.PickSized(model, Cost{}, turn, nowMs)
}

// PickSized selects a candidate for a request of model and cost
// (docs/protocol.md §4.12) at nowMs on the store timeline. The refusals
// are the same under every policy; among the healthy candidates the
// snapshot's policy draws (its picker), which may count the send in its
// own-send counters, the one write of the request path. It allocates
// nothing.
func (s *Snapshot) PickSized(model string, cost Cost, turn uint64, nowMs int64) Pick {
	if len(s.Candidates) == 0 {
		return Pick{Outcome: NoRoute}
	}
	if s.Shedding[model] {
		return Pick{Outcome: Shed}
	}
	m, ok := s.byModel[model]
	switch {
	case !ok:
		return Pick{Outcome: UnknownModel}
	case len(m.routable) == 0 && m.admitted:
		return Pick{Outcome: NoRoute}
	case len(m.routable) == 0:
		return Pick{Outcome: NotReady}
	case len(m.healthy) == 0:
		return Pick{Outcome: Fallback, Candidate: &s.Candidates[m.routable[0]]}
	}
	return s.draws().pick(s, m.healthy, cost, turn, nowMs)
}

// weighted draws a position of list by weight (of a candidate's position), skipping position skip (-1:
// none): walk the list subtracting weights from u × total until it goes
// negative. It returns -1 when nothing is left to draw.
func (s *Snapshot) weighted(list []int32, skip int, u float64, w func(i int32) float64) int {
	total := 0.0
	for k, i := range list {
		if k != skip {
			total += w(i)
		}
	}
	target := u * total
	last := -1
	for k, i := range list {
		if k == skip {
			continue
		}
		last = k
		if target -= w(i); target < 0 {
			return k
		}
	}
	return last
}

// weyl maps a request turn to [0, 1) along the golden-ratio sequence:
// consecutive turns fall evenly apart, so draws by weight over a run of
// requests follow the weights closely (as a weighted round robin would),
// and gateways starting at unrelated turns do not move in step.
func weyl(turn uint64) float64 {
	return float64(turn*0x9E3779B97F4A7C15>>11) / (1 << 53)
}

// fullness is a picker that can tell, without drawing, that every site of
// a model is full (the age-aware policy, by its own count).
type fullness interface {
	full(s *Snapshot, healthy []int32, nowMs int64) bool
}

// Full reports whether, at nowMs, every healthy site serving model is
// full as the snapshot's policy reads it: a request picked now would wait
// in a site's queue, whichever. A gateway that holds requests while the
// grid is full (availability.holdWhenFull) asks it before a pick, and
// again while it holds the request. It is false when the policy cannot tell
// (the reference; the age-aware policy holding too few requests to
// count), and for a model the pick would refuse or fall back for. It
// counts nothing and allocates nothing.
func (s *Snapshot) Full(model string, nowMs int64) bool {
	if s.Shedding[model] {
		return false
	}
	m, ok := s.byModel[model]
	if !ok || len(m.healthy) == 0 {
		return false
	}
	f, ok := s.draws().(fullness)
	return ok && f.full(s, m.healthy, nowMs)
}
