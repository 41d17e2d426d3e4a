package main

import (
	"context"
	"fmt"

	"github.com/grid-inference/grid/internal/routesim"
)

func runBench(_ context.Context, args []string, e *env) error {
	if len(args) == 0 || args[0] != "routing" {
		return fmt.Errorf("%w: want `grid bench routing`", errUsage)
	}
	fs := newFlagSet("bench routing", e)
	quick := fs.Bool("quick", false, "a subset that runs in under a minute")
	requests := fs.Int("requests", 100_000, "requests per cell")
	seed := fs.Uint64("seed", 7, "simulation seed")
	sweep := fs.Bool("sweep", false, "also the robustness sweep: loads 0.7/0.9/0.95 and K = 1/4/16 against weighted round robin")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	scenarios, ages := routesim.Scenarios, routesim.Ages
	if *quick {
		scenarios, ages, *requests = scenarios[:1], []float64{0.5, 2, 10}, 20_000
	}
	for _, sc := range scenarios {
		routesim.WriteTable(e.stdout, sc, ages, *requests, *seed)
	}
	if *sweep {
		for _, sc := range []routesim.Scenario{routesim.Scenarios[0], routesim.Scenarios[3]} {
			routesim.WriteSweep(e.stdout, sc.Slots, sc.Lognormal, routesim.SweepLoads, routesim.SweepGateways, ages, *requests, *seed)
		}
	}
	return nil
}
