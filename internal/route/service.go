package route

import (
	"math"
	"sync"
)

// ServiceTime estimates the mean duration of a request served without
// waiting: the unit in which the age-aware policy reads a reading's age
// (Settings.MeanDurationMs). Durations that include a queue would feed on
// herding: once requests wait, durations grow, readings look younger than
// they are, and the policy trusts them harder (measured in
// internal/routesim, phases sync). Two guards keep the queue out:
//
//   - it learns only from requests sent where the pick saw a free slot
//     (Pick.Room);
//   - it is the least of the means of the last serviceWindows windows of
//     serviceWindow such requests, as a TCP sender takes the least recent
//     round trip for the path's own delay: a herd that sets in lengthens
//     the windows it fills, not the ones before it. A real change in
//     request length is learned once the windows before it have aged out
//     (serviceWindows × serviceWindow requests). Erring low is the safe
//     side: readings then look older, and the policy leans on capacity.
//
// It starts at 10 s, a typical LLM request; until the first window fills it
// is the mean of what it has seen. Any goroutine may call it.
type ServiceTime struct {
	mu      sync.Mutex
	sum     float64 // of the window being filled, ms
	count   int
	windows [serviceWindows]float64 // full windows' means, ms; 0 = not yet
	next    int                     // the slot the next full window takes
}

const (
	serviceWindow  = 100
	serviceWindows = 8
)

// Observe records a request's duration; one sent without room teaches
// nothing.
func (s *ServiceTime) Observe(ms float64, room bool) {
	if !room || !(ms > 0) || math.IsInf(ms, 1) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sum += ms
	s.count++
	if s.count == serviceWindow {
		s.windows[s.next] = s.sum / serviceWindow
		s.next = (s.next + 1) % serviceWindows
		s.sum, s.count = 0, 0
	}
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
	return 10_000
}
