package routesim

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
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
