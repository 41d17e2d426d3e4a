package route

import (
	"fmt"

	"github.com/grid-inference/grid/internal/loadstore"
)

// Policy is a routing policy: how a snapshot's healthy candidates of one
// model are drawn from (docs/routing.md). Everything else — the readings,
// the learned ceilings, shedding, the refusals of Pick, affinity's rules —
// is the same under every policy.
//
// The builder hands each snapshot it builds to its policy once, before the
// snapshot is published (prepare, under Builder.mu); the policy returns
// the picker the snapshot's picks read: its own per-candidate state,
// immutable but for the own-send counters a policy may keep. A policy's
// state that outlives one snapshot (own-send counters by provider) is
// touched only there and in forget, under the same lock.
//
// The methods are unexported: a policy is written in this package, as a
// type beside the others, and chosen by name (NewPolicy).
type Policy interface {
	// Name is the policy's availability.policy value.
	Name() string
	// prepare reads snap, just built at nowMs, and returns what its picks
	// read. It may set each candidate's view fields (Predicted, Active).
	prepare(snap *Snapshot, nowMs int64) picker
	// forget drops what the policy keeps of providers the store forgot.
	forget(keys []loadstore.Key)
}

// picker is one snapshot's reading by its policy. Its methods may be
// called from any goroutine, and allocate nothing.
type picker interface {
	// pick draws among healthy (positions in s of one model's healthy
	// candidates, in snapshot order; at least one) at nowMs for a request
	// of cost, turn being the request's draw.
	pick(s *Snapshot, healthy []int32, cost Cost, turn uint64, nowMs int64) Pick
	// loadAt reads candidate i's load (in-flight over its ceiling) at
	// nowMs as the picks do: board is what the readings say, load adds
	// what the policy knows of this gateway's own sends.
	loadAt(s *Snapshot, i int32, nowMs int64) (board, load float64)
	// sent counts a send to candidate i that affinity decided, at nowMs,
	// the board reading board.
	sent(s *Snapshot, i int32, nowMs int64, board float64)
	// restrict is the picker of the snapshot narrowed to the candidates
	// at positions kept (Snapshot.Restrict), r.
	restrict(r *Snapshot, kept []int32) picker
}

// Policy names, the values of availability.policy.
const (
	PolicyAgeAware  = "age-aware"
	PolicyReference = "reference"
	PolicyLatency   = "latency"
)

// PolicyNames lists the policies NewPolicy makes, the default first.
var PolicyNames = []string{PolicyAgeAware, PolicyReference, PolicyLatency}

// NewPolicy makes the policy named name. service is the gateway's observed
// service: the unit in which the age-aware and latency policies read a
// reading's age, and what the latency policy observed of the sites;
// policies that read neither ignore it.
func NewPolicy(name string, service *Service) (Policy, error) {
	switch name {
	case PolicyAgeAware:
		return NewAgeAware(service, AgeAwareOptions{}), nil
	case PolicyReference:
		return Reference{}, nil
	case PolicyLatency:
		return NewLatency(service, service), nil
	}
	return nil, fmt.Errorf("unknown routing policy %q (want one of %v)", name, PolicyNames)
}
