package route

import (
	"math"
	"testing"
)

// latencyWorld: sites home (this site's, 8 slots) and far (a peer's, 8
// slots, round trip rttMs), a mean request of 1 s, capacities learned at
// 1000 ms; the latency policy reads them at 2000 ms.
func latencyWorld(t *testing.T, rttMs float64) *world {
	w := newWorld(t, "home", "far")
	w.cands[0].Local = true
	w.meanMs, w.set.WindowMs = 1000, 60_000
	w.obs = &Service{}
	if rttMs > 0 {
		w.obs.RoundTrip("far").Observe(rttMs)
	}
	w.publish("home", 1000, obs{running: 8, queue: f(0)})
	w.publish("far", 1000, obs{running: 8, queue: f(0)})
	w.build(1000)
	return w
}

// picks draws n picks at ms and counts where they went, and by which path.
func picks(snap *Snapshot, ms int64, n int) (bySite map[string]int, byPath map[Path]int) {
	bySite, byPath = map[string]int{}, map[Path]int{}
	for turn := range uint64(n) {
		p := boardOnly(snap).Pick("m", turn, ms)
		bySite[p.Candidate.Site]++
		byPath[p.Path]++
	}
	return bySite, byPath
}

// TestRemoteMustWinByMoreThanItsRoundTrip: under the latency policy a
// request stays on this site while the wait its load predicts for one
// more request is no longer than the round trip to an idle peer, however
// much idler the peer reads. home full (8 of 8, fresh): one more waits an
// eighth of a mean request, 125 ms; far idle. Across a 50 ms round trip
// the peer is sooner; across 200 ms home is. With home at half load it
// stays home either way, though the peer reads emptier (the age-aware
// policy splits by load).
func TestRemoteMustWinByMoreThanItsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rttMs       float64
		homeRunning float64
		wantHome    bool
	}{
		{"full home, near peer", 50, 8, false},
		{"full home, far peer", 200, 8, true},
		{"half-loaded home, near peer", 50, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := latencyWorld(t, tc.rttMs)
			w.publish("home", 2000, obs{running: tc.homeRunning, queue: f(0)})
			w.publish("far", 2000, obs{running: 0, queue: f(0)})
			bySite, byPath := picks(w.build(2000), 2000, 40)
			if tc.wantHome && (bySite["home"] != 40 || byPath[PathStayLocal] != 40) {
				t.Errorf("picks %v by %v: want all 40 kept home (stay_local)", bySite, byPath)
			}
			if !tc.wantHome && bySite["far"] < 30 {
				t.Errorf("picks %v by %v: want most sent to the peer", bySite, byPath)
			}
		})
	}
}

// TestClaimedFastObservedSlowIsReadSlow: a peer that reads idle, but whose
// answers to this gateway waited 800 ms at that load, is read at its
// observed wait: home, full (one more request waits 125 ms), keeps the
// requests the peer's board would have drawn.
func TestClaimedFastObservedSlowIsReadSlow(t *testing.T) {
	for _, observed := range []bool{false, true} {
		w := latencyWorld(t, 10)
		if observed {
			for range 8 {
				w.obs.Waits("far").Observe(0.1, 800)
			}
		}
		w.publish("home", 2000, obs{running: 8, queue: f(0)})
		w.publish("far", 2000, obs{running: 0, queue: f(0)})
		bySite, _ := picks(w.build(2000), 2000, 40)
		switch {
		case observed && bySite["home"] != 40:
			t.Errorf("the peer observed slow: picks %v, want all 40 home", bySite)
		case !observed && bySite["far"] < 30:
			t.Errorf("the peer as its board says: picks %v, want most to it", bySite)
		}
	}
}

// TestLatencyWithoutRoundTripsIsTheDefault: with no site of its own and
// every request of unknown size, the latency policy draws as the
// age-aware one does when that reads the spread of each site's predicted
// load (AgeAwareOptions.Uncertain), but for holding a persisting backlog.
func TestLatencyWithoutRoundTripsIsTheDefault(t *testing.T) {
	run := func(latency bool) map[string]int {
		w := newWorld(t, "a", "b", "c")
		w.ageAware, w.uncertain, w.meanMs = true, true, 1000
		if latency {
			w.obs = &Service{}
		}
		for i, s := range []string{"a", "b", "c"} {
			w.publish(s, 1000, obs{running: float64(8 * (i + 1)), queue: f(0)})
		}
		w.build(1000)
		for i, s := range []string{"a", "b", "c"} {
			w.publish(s, 2000, obs{running: float64(2 * i), queue: f(0)})
		}
		got, _ := picks(w.build(2000), 2300, 200)
		return got
	}
	if aa, lat := run(false), run(true); aa["a"] != lat["a"] || aa["b"] != lat["b"] || aa["c"] != lat["c"] {
		t.Errorf("age-aware drew %v, latency %v: want the same draws", aa, lat)
	}
}

// TestLatencyOwnCountDecidesWhenInformed: with no round trip to weigh,
// the latency policy sends where the age-aware policy would, its own
// count deciding once it holds enough (TestOwnCountDecidesWhenInformed).
// Drawing by share at any count, it trailed the default by up to 1.38×
// in the harness (one site four times slower, 16 gateways).
func TestLatencyOwnCountDecidesWhenInformed(t *testing.T) {
	latency := func(w *world) { w.obs = &Service{} }
	toA := func(snap *Snapshot) (n int, paths map[Path]int) {
		paths = map[Path]int{}
		for turn := range uint64(40) {
			p := snap.Pick("m", turn, 2100)
			paths[p.Path]++
			if p.Candidate.Site == "a" {
				n++
			}
		}
		return n, paths
	}
	// The board reads both sites alike; this gateway holds ten requests
	// at a and none at b.
	snap, _ := heldWorld(t, latency, 8, 8, 10, 0)
	if n, paths := toA(snap); n != 0 || paths[PathOwnCount] != 40 {
		t.Errorf("holding 10 at a and none at b, a took %d of 40 (paths %v); want none, by the own count", n, paths)
	}
	// Holding four, the draw decides: both sites are drawn.
	snap, _ = heldWorld(t, latency, 8, 8, 4, 0)
	if n, paths := toA(snap); n == 0 || n == 40 || paths[PathOwnCount] != 0 {
		t.Errorf("holding four, a took %d of 40 (paths %v); want the draw", n, paths)
	}
	// The same count tells when every site is full, for
	// availability.holdWhenFull (TestFullByTheOwnCount).
	if snap, _ := heldWorld(t, latency, 32, 32, 16, 16); !snap.Full("m", 2100) {
		t.Error("both sites hold their 32 by the own count: want full under the latency policy too")
	}
}

func TestWaitCurve(t *testing.T) {
	var c WaitCurve
	if _, ok := c.AtMs(0.5); ok {
		t.Fatal("an empty curve has an opinion")
	}
	for range waitMinSamples - 1 {
		c.Observe(0.95, 100)
	}
	if _, ok := c.AtMs(0.95); ok {
		t.Fatalf("%d samples: want no opinion before %d", waitMinSamples-1, waitMinSamples)
	}
	c.Observe(0.95, 100)
	if ms, ok := c.AtMs(0.95); !ok || ms != 100 {
		t.Errorf("the 0.9-1 band after four waits of 100 ms: %v %v", ms, ok)
	}
	if _, ok := c.AtMs(0.5); ok {
		t.Error("a band below the one observed has an opinion")
	}
	if ms, _ := c.AtMs(1.6); ms != 100 {
		t.Errorf("at 1.6, above the observed band: %v ms, want 100 (a wait does not fall as load rises)", ms)
	}
	for range 200 {
		c.Observe(1.3, 40)
	}
	if ms, _ := c.AtMs(1.3); ms != 100 {
		t.Errorf("a band of shorter waits above a longer one reads %v, want 100", ms)
	}
	for range 200 {
		c.Observe(0.95, 10)
	}
	if ms, _ := c.AtMs(0.95); math.Abs(ms-10) > 1 {
		t.Errorf("after 200 waits of 10 ms the band reads %v: want about 10 (a moving mean of about %d)", ms, waitWindow)
	}
}

func TestRoundTripSmooths(t *testing.T) {
	var r RoundTrip
	if _, ok := r.Ms(); ok {
		t.Fatal("no sample, yet an estimate")
	}
	r.Observe(80)
	r.Observe(0)
	if ms, ok := r.Ms(); !ok || ms != 70 {
		t.Errorf("80 then 0: %v ms, want 70 (an eighth of the way)", ms)
	}
}

// TestCostModelLearns: streams whose first token takes 20 ms plus 50 µs a
// prompt token, and whose decode takes 5 ms a token of their max_tokens.
func TestCostModelLearns(t *testing.T) {
	var m CostModel
	if w := m.Weight(Cost{Prompt: 20_000}); w != 1 {
		t.Fatalf("untaught weight %v, want 1", w)
	}
	for i := range 400 {
		c := Cost{Prompt: 100 + 97*(i%200), MaxOutput: 50 + 13*(i%37)}
		m.Observe(c, 20+0.05*float64(c.Prompt), 5*float64(c.MaxOutput), true)
		// A stream that waited in a queue teaches no prefill.
		m.Observe(Cost{Prompt: 100, MaxOutput: c.MaxOutput}, 3000, 5*float64(c.MaxOutput), false)
	}
	if got := m.PrefillMs(Cost{Prompt: 10_000}); math.Abs(got-500) > 1 {
		t.Errorf("prefill of 10,000 tokens: %v ms, want 500", got)
	}
	if base, ok := m.FirstTokenMs(Cost{}); !ok || math.Abs(base-20) > 0.5 {
		t.Errorf("first token of an empty prompt: %v %v, want 20 ms", base, ok)
	}
	small, large := m.Weight(Cost{Prompt: 100, MaxOutput: 10}), m.Weight(Cost{Prompt: 20_000, MaxOutput: 1000})
	if !(small < 0.2) || !(large > 3) {
		t.Errorf("weights: 100 + 10 tokens %v, 20,000 + 1,000 %v: want a small and a large request told apart", small, large)
	}
}

func TestLatencyPickAllocatesNothing(t *testing.T) {
	w := latencyWorld(t, 30)
	w.publish("home", 2000, obs{running: 8, queue: f(2)})
	w.publish("far", 2000, obs{running: 3, queue: f(0)})
	snap := w.build(2000)
	turn := uint64(0)
	if n := testing.AllocsPerRun(1000, func() {
		turn++
		snap.PickSized("m", Cost{Prompt: 800, MaxOutput: 100}, turn, 2100)
	}); n != 0 {
		t.Errorf("the latency pick allocates %v times", n)
	}
}
