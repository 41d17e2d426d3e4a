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
