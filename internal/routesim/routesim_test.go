package routesim

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/route"
)

// TestCalibration: with fresh information and 100 single-slot servers at
// load 0.9, power-of-two lands near the supermarket model's closed form
// (2.61) and random near 1/(1−λ) = 10.
func TestCalibration(t *testing.T) {
	slots := make([]int, 100)
	for i := range slots {
		slots[i] = 1
	}
	n := 200_000
	if raceEnabled {
		n = 60_000
	}
	p2c := Run(Config{Slots: slots, Load: 0.9, Gateways: 1, BoardAge: 0.001, Requests: n, Seed: 1, Policy: P2CStale})
	if math.Abs(p2c.Mean-2.61)/2.61 > 0.05 {
		t.Errorf("P2C mean %.3f, want 2.61 ± 5%%", p2c.Mean)
	}
	rnd := Run(Config{Slots: slots, Load: 0.7, Gateways: 1, BoardAge: 0.001, Requests: 100_000, Seed: 1, Policy: WeightedRandom})
	if math.Abs(rnd.Mean-3.33)/3.33 > 0.08 {
		t.Errorf("random mean %.3f at 0.7, want 3.33", rnd.Mean)
	}
}

// TestRoutingTable prints the policy table for config a (sites 8/16/32,
// load 0.9, K = 4) across board ages, and checks the age-aware policy
// against the oracle and weighted round robin. GRID_ROUTESIM_FULL=1 runs the
// long version.
func TestRoutingTable(t *testing.T) {
	n := 30_000
	ages := []float64{0.1, 0.5, 1, 2, 5, 10}
	switch {
	case os.Getenv("GRID_ROUTESIM_FULL") != "":
		n = 200_000
	case raceEnabled:
		ages = []float64{0.5, 2, 10}
	}
	res := map[string][]Result{}
	for _, p := range Policies {
		for _, T := range ages {
			res[p] = append(res[p], Run(Config{Slots: []int{8, 16, 32}, Load: 0.9, Gateways: 4, BoardAge: T, Requests: n, Seed: 7, Policy: p}))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-16s", "policy \\ T")
	for _, T := range ages {
		fmt.Fprintf(&b, "%14g", T)
	}
	b.WriteString("\n")
	for _, p := range Policies {
		fmt.Fprintf(&b, "%-16s", p)
		for _, r := range res[p] {
			fmt.Fprintf(&b, "%8.2f/%5.1f", r.Mean, r.P99)
		}
		b.WriteString("\n")
	}
	t.Logf("mean/p99 time in system, sites 8/16/32, load 0.9, K=4, %d requests:\n%s", n, b.String())
	for k, T := range ages {
		aa, or, wrr := res[AgeAware][k], res[Oracle][k], res[WeightedRR][k]
		if aa.Mean > 1.25*or.Mean {
			t.Errorf("T=%g: age-aware mean %.2f > 1.25 × oracle %.2f", T, aa.Mean, or.Mean)
		}
		if aa.Mean > 1.1*wrr.Mean {
			t.Errorf("T=%g: age-aware mean %.2f worse than weighted RR %.2f", T, aa.Mean, wrr.Mean)
		}
	}
}

// TestSharedBoardsHoldTheTargets: gateways that read one board (sync) and
// sites whose readings refresh at their own phases (per-site), with readings
// ten mean durations apart, the staleness at which the default herded
// (1.31-1.45 mean durations against the oracle's 1.06). The targets
// on the seeds' mean: within 1.15× of the oracle at K = 4 and 1.25× at
// K = 16, p99 within 1.05× of weighted round robin's. Under the race detector
// one seed of fewer requests runs, against a looser bound: a herd is 2-10×.
func TestSharedBoardsHoldTheTargets(t *testing.T) {
	g := Grid{Slots: []int{8, 16, 32}, Phases: []Phases{PhasesSync, PhasesPerSite}, Gateways: []int{4, 16},
		Loads: []float64{0.9}, Ages: []float64{10}, Policies: []string{WeightedRR, AgeAware, Oracle},
		Seeds: 3, Seed: 7, Requests: 30_000}
	slack := map[int]float64{4: 1.15, 16: 1.25}
	p99Slack := 1.05
	if raceEnabled {
		g.Seeds, g.Requests, g.Gateways = 1, 10_000, []int{4}
		slack[4], p99Slack = 1.35, 1.2
	}
	byKey := map[string]Cell{}
	for _, c := range g.Run() {
		byKey[fmt.Sprint(c.Policy, c.Phases, c.Gateways)] = c
	}
	for _, ph := range g.Phases {
		for _, k := range g.Gateways {
			aa, or, wrr := byKey[fmt.Sprint(AgeAware, ph, k)], byKey[fmt.Sprint(Oracle, ph, k)], byKey[fmt.Sprint(WeightedRR, ph, k)]
			t.Logf("%s K=%d T=10: age-aware %.3f±%.3f/p99 %.2f, oracle %.3f, weighted-rr %.3f/p99 %.2f", ph, k, aa.Mean, aa.MeanCI, aa.P99, or.Mean, wrr.Mean, wrr.P99)
			if aa.Mean > slack[k]*or.Mean {
				t.Errorf("%s, K=%d, T=10: age-aware mean %.3f > %.2f × the oracle's %.3f", ph, k, aa.Mean, slack[k], or.Mean)
			}
			if aa.P99 > p99Slack*wrr.P99 {
				t.Errorf("%s, K=%d, T=10: age-aware p99 %.2f > %.2f × weighted round robin's %.2f", ph, k, aa.P99, p99Slack, wrr.P99)
			}
		}
	}
}

// TestWriteRatios: each policy's mean and p99 over weighted round robin's
// in the same cell, the cells worse beyond both intervals marked.
func TestWriteRatios(t *testing.T) {
	g := Grid{Slots: []int{8, 16}, Phases: []Phases{PhasesSync}, Gateways: []int{4}, Loads: []float64{0.9},
		Ages: []float64{1, 10}, Policies: []string{WeightedRR, AgeAware}, Seeds: 3, Requests: 1000, Scenario: ChangeNone}
	cells := []Cell{
		{Policy: WeightedRR, Phases: PhasesSync, Gateways: 4, Load: 0.9, T: 1, Mean: 1.2, MeanCI: 0.05, P99: 5},
		{Policy: WeightedRR, Phases: PhasesSync, Gateways: 4, Load: 0.9, T: 10, Mean: 1.2, MeanCI: 0.05, P99: 5},
		{Policy: AgeAware, Phases: PhasesSync, Gateways: 4, Load: 0.9, T: 1, Mean: 1.08, MeanCI: 0.02, P99: 4.5},
		{Policy: AgeAware, Phases: PhasesSync, Gateways: 4, Load: 0.9, T: 10, Mean: 1.5, MeanCI: 0.1, P99: 6},
	}
	var b strings.Builder
	g.WriteRatios(&b, cells, WeightedRR)
	want := `age-aware / weighted-rr, mean/p99 time in system, sites 8/16, exponential, scenario none (1000 requests × 3 seeds; * worse beyond both 95% intervals)
  load  K  phases        T=1        T=10
   0.9  4    sync  0.90/0.90  1.25/1.20*

`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestLongWarmUpEnds: a run whose warm-up (ten refresh intervals) takes more
// arrivals than four runs' worth still measures its requests and ends; the
// arrivals stopped before measuring began, and the run went on refreshing
// readings forever (64 sites, readings ten mean durations apart).
func TestLongWarmUpEnds(t *testing.T) {
	slots := make([]int, 64)
	for i := range slots {
		slots[i] = 4 << (i % 4)
	}
	done := make(chan Result, 1)
	go func() {
		done <- Run(Config{Slots: slots, Load: 0.9, Gateways: 4, BoardAge: 10, Phases: PhasesPerSite, Requests: 2000, Seed: 1, Policy: WeightedRR})
	}()
	select {
	case r := <-done:
		if !(r.Mean > 0) {
			t.Errorf("mean time in system %v, want a measurement", r.Mean)
		}
	case <-time.After(time.Minute):
		t.Fatal("a run whose warm-up outlasts four runs' arrivals did not end within a minute")
	}
}

// TestColdStartAndRestartDoNotHerd: the first 20 refresh intervals of an
// empty grid at load 0.9, and the 20 after every gateway restarts into a
// loaded one, sites 8/8/16/32/64, K = 4, readings one, five and ten mean
// durations apart, every phase mode. A gateway starts from what it reads
// first: at a cold start the idle grid's readings one site at a time,
// with each site's ready units (the ceiling floor is credited per unit),
// the sites not read yet assumed idle at the floor; after a restart the
// readings its operator holds, with their ages. Ignoring the sites not
// read yet cost up to 1.06× weighted round robin's mean (sync, T = 10).
// Before the ceiling floor
// was credited per ready unit every site looked like an 8-slot one and a
// cold start cost 1.53-1.80 mean durations at T = 10 against weighted
// round robin's 1.09; while the harness had a gateway route blind until
// its first refresh (a real one refuses until it has read its operator),
// 1.10-1.16×. Held: the age-aware mean within 1.05× of weighted round
// robin's.
func TestColdStartAndRestartDoNotHerd(t *testing.T) {
	for _, sc := range []Change{ColdStart, Restart} {
		g := Grid{Slots: []int{8, 8, 16, 32, 64}, Phases: AllPhases, Gateways: []int{4},
			Loads: []float64{0.9}, Ages: []float64{1, 5, 10}, Policies: []string{WeightedRR, AgeAware},
			Seeds: 3, Seed: 7, Scenario: sc}
		if raceEnabled {
			g.Seeds, g.Phases, g.Ages = 1, []Phases{PhasesPerSite}, []float64{10}
		}
		byKey := map[string]Cell{}
		for _, c := range g.Run() {
			byKey[fmt.Sprint(c.Policy, c.Phases, c.T)] = c
		}
		for _, ph := range g.Phases {
			for _, T := range g.Ages {
				aa, wrr := byKey[fmt.Sprint(AgeAware, ph, T)], byKey[fmt.Sprint(WeightedRR, ph, T)]
				t.Logf("%s %s T=%g: age-aware %.3f±%.3f/p99 %.2f, weighted-rr %.3f/p99 %.2f", sc, ph, T, aa.Mean, aa.MeanCI, aa.P99, wrr.Mean, wrr.P99)
				if aa.Mean > 1.05*wrr.Mean {
					t.Errorf("%s, %s, T=%g: age-aware mean %.3f > 1.05 × weighted round robin's %.3f", sc, ph, T, aa.Mean, wrr.Mean)
				}
			}
		}
	}
}

// TestLeastConnCountsItsOwnRequests: with one gateway, its own requests
// in flight are the whole load, so least-conn routes as the oracle does
// however old the board is, where a policy of the board alone herds.
func TestLeastConnCountsItsOwnRequests(t *testing.T) {
	run := func(policy string) Result {
		return Run(Config{Slots: []int{8, 16, 32}, Load: 0.9, Gateways: 1, BoardAge: 10, Requests: 20_000, Seed: 3, Policy: policy})
	}
	lc, or, stale := run(LeastConn), run(Oracle), run(JSQStale)
	if lc.Mean > 1.03*or.Mean {
		t.Errorf("least-conn mean %.3f with one gateway, oracle %.3f: want within 3%%", lc.Mean, or.Mean)
	}
	if stale.Mean < 2*lc.Mean {
		t.Errorf("jsq-stale mean %.3f at T = 10, least-conn %.3f: the board alone should herd", stale.Mean, lc.Mean)
	}
}

// TestOverloadScenariosShiftTheLoad: the harness's versions of grid bench
// sites' external-load and capacity-drop (sites 8/16/32, load 0.85,
// lognormal σ = 1, 3 gateways, readings a quarter of a mean duration
// apart). Either event overloads the grid for three mean durations in
// every eighteen; static weights keep sending the biggest site its share, and
// its queue outlasts the event. Held: weighted round robin's p99 wait at
// least 1.5× the oracle's (the scenario loads what it says), and the
// age-aware mean and p99 wait within 1.2× the oracle's.
func TestOverloadScenariosShiftTheLoad(t *testing.T) {
	for _, sc := range []Change{ExternalLoad, CapacityDrop} {
		g := Grid{Slots: []int{8, 16, 32}, Sigma: 1, Phases: []Phases{PhasesPerSite}, Gateways: []int{3},
			Loads: []float64{0.85}, Ages: []float64{0.25}, Policies: []string{WeightedRR, AgeAware, Oracle},
			Seeds: 3, Seed: 7, Requests: 20_000, Scenario: sc}
		if raceEnabled {
			g.Seeds = 1
		}
		by := map[string]Cell{}
		for _, c := range g.Run() {
			by[c.Policy] = c
		}
		wrr, aa, or := by[WeightedRR], by[AgeAware], by[Oracle]
		t.Logf("%s: mean / p99 wait: weighted-rr %.2f / %.2f, age-aware %.2f / %.2f, oracle %.2f / %.2f", sc, wrr.Mean, wrr.WaitP99, aa.Mean, aa.WaitP99, or.Mean, or.WaitP99)
		if wrr.WaitP99 < 1.5*or.WaitP99 {
			t.Errorf("%s: weighted round robin's p99 wait %.2f is within 1.5× the oracle's %.2f: the event does not overload the biggest site", sc, wrr.WaitP99, or.WaitP99)
		}
		if aa.Mean > 1.2*or.Mean || aa.WaitP99 > 1.2*or.WaitP99 {
			t.Errorf("%s: age-aware mean %.2f, p99 wait %.2f; want within 1.2× the oracle's %.2f, %.2f", sc, aa.Mean, aa.WaitP99, or.Mean, or.WaitP99)
		}
	}
}

// TestStreamsWithRoomTeachTheCostModel: a stream that found a free slot
// waited for nothing, however the two instants it is measured between
// round. Sixteen of them teach the gateway's cost model its first token
// without a wait, and a queued one then teaches its wait curve; a wait
// read a hair above 0 once taught neither, so the latency policy's
// observed waits and its sends weighed by their work never ran in the
// harness.
func TestStreamsWithRoomTeachTheCostModel(t *testing.T) {
	g := &gateway{service: &route.Service{}}
	c := route.Cost{Prompt: 100, MaxOutput: 10}
	for i := range 16 {
		g.judgeAndTeach("a", request{cost: c}, float64(i+1)*unit, 1e-11, unit)
	}
	if _, ok := g.service.Costs().FirstTokenMs(c); !ok {
		t.Fatal("16 streams served at once did not teach the cost model a first token without a wait")
	}
	queued := request{cost: c, queued: true, load: route.Opt{V: 1.2, OK: true}}
	for range 4 {
		g.judgeAndTeach("a", queued, 20*unit, 300, unit)
	}
	if ms, ok := g.service.Waits("a").AtMs(1.2); !ok || math.Abs(ms-300) > 1 {
		t.Errorf("four queued streams that waited 300 ms taught the wait curve %v (%v), want 300", ms, ok)
	}
}

// TestEveryChangeIsSummarised: `grid bench routing --help` names every
// scenario with what it does, so a scenario added to Changes needs a
// summary.
func TestEveryChangeIsSummarised(t *testing.T) {
	for _, c := range Changes {
		if c.Summary() == "" {
			t.Errorf("scenario %q has no summary", c)
		}
	}
}
