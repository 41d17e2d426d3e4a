package route

import "testing"

// TestServiceTimeIgnoresAHerd: the age unit is the least recent window's
// mean of requests sent with room; a herd that sets in (durations five
// times longer) does not make readings look younger until the windows
// before it have aged out, requests sent without room teach nothing, and a
// lasting change is learned in the end.
func TestServiceTimeIgnoresAHerd(t *testing.T) {
	var s ServiceTime
	if got := s.MeanMs(); got != 10_000 {
		t.Fatalf("before any request: %v ms, want the 10 s prior", got)
	}
	s.Observe(800, true)
	s.Observe(1200, true)
	if got := s.MeanMs(); got != 1000 {
		t.Fatalf("two requests: %v ms, want their mean 1000", got)
	}
	for range 2*serviceWindow - 2 {
		s.Observe(1000, true)
	}
	for range 1000 {
		s.Observe(60_000, false) // waited behind a queue the pick saw
	}
	if got := s.MeanMs(); got != 1000 {
		t.Fatalf("after requests without room: %v ms, want 1000", got)
	}
	for range (serviceWindows - 2) * serviceWindow {
		s.Observe(5000, true) // a herd: requests wait though the pick saw room
	}
	if got := s.MeanMs(); got != 1000 {
		t.Errorf("during a herd: %v ms, want 1000 (the windows before it)", got)
	}
	for range 2 * serviceWindow {
		s.Observe(5000, true)
	}
	if got := s.MeanMs(); got != 5000 {
		t.Errorf("once every window is longer: %v ms, want 5000 (a lasting change is learned)", got)
	}
}

// TestServiceTimeStreamsSeeNoQueue: a stream's wait comes before its first
// token, so a herd that makes most requests wait (five seconds to first
// token instead of 50 ms; the few sent elsewhere do not) teaches nothing:
// the unit stays decode plus the least recent time to first token, however
// long the herd lasts.
func TestServiceTimeStreamsSeeNoQueue(t *testing.T) {
	var s ServiceTime
	for range serviceWindow {
		s.ObserveStream(50, 950)
	}
	if got := s.MeanMs(); got != 1000 {
		t.Fatalf("streams without a wait: %v ms, want 1000", got)
	}
	for i := range 20 * serviceWindow {
		if i%10 == 0 {
			s.ObserveStream(50, 950)
		} else {
			s.ObserveStream(5050, 950) // waited five seconds in a queue
		}
	}
	if got := s.MeanMs(); got > 1100 {
		t.Errorf("during a long herd: %v ms, want about 1000 (decode plus the least first token)", got)
	}
	var fresh ServiceTime
	for range serviceWindow {
		fresh.ObserveStream(5050, 950) // the herd from the start
	}
	if got := fresh.MeanMs(); got > 6000 {
		t.Errorf("a herd from the first request: %v ms, want at most the whole duration", got)
	}
}

// TestServiceTimeForgetsAZeroFirstToken: a first token at once (0 ms, as a
// simulated engine with no prefill answers) is a time to first token like
// any other, forgotten when its windows are: engines that later take 200 ms
// to their first token are read in decode plus 200 ms.
func TestServiceTimeForgetsAZeroFirstToken(t *testing.T) {
	var s ServiceTime
	for range serviceWindow {
		s.ObserveStream(0, 950)
	}
	if got := s.MeanMs(); got != 950 {
		t.Fatalf("streams with an instant first token: %v ms, want 950", got)
	}
	for range (serviceWindows + 2) * serviceWindow {
		s.ObserveStream(200, 950)
	}
	if got := s.MeanMs(); got != 1150 {
		t.Errorf("after the first tokens slowed to 200 ms: %v ms, want 1150", got)
	}
}
