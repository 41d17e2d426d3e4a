package latency

import (
	"math"
	"testing"
	"time"
)

func f(v float64) *float64 { return &v }

func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name    string
		q       float64
		buckets []Bucket
		want    float64
		ok      bool
	}{
		{"empty", 0.5, nil, 0, false},
		{"no observations", 0.5, []Bucket{{1, 0}, {inf, 0}}, 0, false},
		{"interpolates in the first bucket from 0", 0.5, []Bucket{{1, 10}, {inf, 10}}, 0.5, true},
		{"interpolates between bounds", 0.5, []Bucket{{0.1, 0}, {0.2, 20}, {inf, 20}}, 0.15, true},
		{"p90 in an upper bucket", 0.9, []Bucket{{0.1, 50}, {0.5, 90}, {1, 100}, {inf, 100}}, 0.5, true},
		{"rank in +Inf returns the previous bound", 0.9, []Bucket{{0.1, 10}, {0.5, 20}, {inf, 100}}, 0.5, true},
		{"equal counts return the bound", 0.5, []Bucket{{0.1, 10}, {0.2, 10}, {inf, 20}}, 0.1, true},
		{"q=1 lands on the top bound", 1, []Bucket{{0.1, 10}, {0.2, 15}}, 0.2, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Quantile(tc.q, tc.buckets)
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("Quantile(%v) = %v, %v; want %v, %v", tc.q, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// snap builds a snapshot where n streaming requests all had TTFT in
// (0.1, 0.2], TPOT sum tpotSum over n, and errs of reqs failed.
func snap(n, tpotSum, reqs, errs float64) Snapshot {
	s := Snapshot{TTFTCount: n, TTFTSum: 0.15 * n, TPOTCount: n, TPOTSum: tpotSum, Requests: reqs, Errors: errs}
	s.AddTTFTBucket(0.1, 0)
	s.AddTTFTBucket(0.2, n)
	s.AddTTFTBucket(math.Inf(1), n)
	return s
}

func TestHistoryWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at        time.Duration
		snap      Snapshot
		multiPool bool
		want      Published
		progress  bool
	}{
		// First snapshot: nothing to diff against.
		{0, snap(100, 1, 100, 0), false, Published{}, false},
		// 19 more requests: below MinSamples, nothing published, but the
		// TTFT count rose: progress.
		{10 * time.Second, snap(119, 1.19, 119, 0), false, Published{}, true},
		// 20 over the window: published. p50 interpolates to 0.15, p90 0.19.
		{20 * time.Second, snap(120, 1.4, 120, 5), false, Published{TTFTP50: f(0.15), TTFTP90: f(0.19), TPOT: f(0.02), ErrorRatio: f(0.25)}, true},
		// No change: no progress; the window still holds the 20.
		{25 * time.Second, snap(120, 1.4, 120, 5), false, Published{TTFTP50: f(0.15), TTFTP90: f(0.19), TPOT: f(0.02), ErrorRatio: f(0.25)}, false},
		// 40s: the snapshot at 0 has fallen out; front is t=10 (119): 1 request.
		{40 * time.Second, snap(120, 1.4, 120, 5), false, Published{}, false},
		// A counter went down: restart, history cleared, nothing published.
		{45 * time.Second, snap(30, 0.3, 30, 0), false, Published{}, false},
		// 25 more after the restart: published from the restart snapshot.
		{50 * time.Second, snap(55, 0.55, 55, 0), false, Published{TTFTP50: f(0.15), TTFTP90: f(0.19), TPOT: f(0.01), ErrorRatio: f(0)}, true},
		// A multi-pool EPP publishes nothing and shows no progress.
		{55 * time.Second, snap(99, 0.99, 99, 0), true, Published{}, false},
	}
	var h History
	for i, st := range steps {
		pub, progress := h.Observe(t0.Add(st.at), st.snap, st.multiPool)
		if progress != st.progress {
			t.Errorf("step %d: progress %v, want %v", i, progress, st.progress)
		}
		for _, c := range []struct {
			name      string
			got, want *float64
		}{{"p50", pub.TTFTP50, st.want.TTFTP50}, {"p90", pub.TTFTP90, st.want.TTFTP90}, {"tpot", pub.TPOT, st.want.TPOT}, {"errors", pub.ErrorRatio, st.want.ErrorRatio}} {
			switch {
			case (c.got == nil) != (c.want == nil):
				t.Errorf("step %d %s: got %v, want %v", i, c.name, c.got, c.want)
			case c.got != nil && math.Abs(*c.got-*c.want) > 1e-9:
				t.Errorf("step %d %s: got %v, want %v", i, c.name, *c.got, *c.want)
			}
		}
	}
}

func TestErrorRatioClamped(t *testing.T) {
	var h History
	t0 := time.Unix(0, 0)
	h.Observe(t0, Snapshot{Requests: 0, Errors: 0}, false)
	// More errors than requests (they are recorded at different times).
	pub, _ := h.Observe(t0.Add(time.Second), Snapshot{Requests: 20, Errors: 30}, false)
	if pub.ErrorRatio == nil || *pub.ErrorRatio != 1 {
		t.Fatalf("error ratio %v", pub.ErrorRatio)
	}
}
