package main

import (
	"bytes"
	"context"
	"fmt"
	"os"

	"github.com/grid-inference/grid/internal/routeplot"
	"github.com/grid-inference/grid/internal/routesim"
)

func runBench(_ context.Context, args []string, e *env) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help") {
		fmt.Fprint(e.stdout, "Usage: grid bench <subcommand> [flags]\n\nSubcommands:\n"+
			"  routing  simulate routing policies under stale load readings and print their tables\n\n"+
			"Run 'grid bench routing --help' for its flags.\n")
		return nil
	}
	if len(args) == 0 || args[0] != "routing" {
		return fmt.Errorf("%w: want `grid bench routing`", errUsage)
	}
	fs := newFlagSet("bench routing", e)
	quick := fs.Bool("quick", false, "a subset that runs in under a minute")
	requests := fs.Int("requests", 100_000, "requests per cell")
	seed := fs.Uint64("seed", 7, "simulation seed")
	sweep := fs.Bool("sweep", false, "also the robustness sweep: loads 0.7/0.9/0.95 and K = 1/4/16 against weighted round robin")
	plotPath := fs.String("plot", "", "also write a PNG of mean and p99 against staleness per policy to this file")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	scenarios, ages := routesim.Scenarios, routesim.Ages
	if *quick {
		scenarios, ages, *requests = scenarios[:1], []float64{0.5, 2, 10}, 20_000
	}
	var tables []routesim.Table
	for _, sc := range scenarios {
		t := routesim.RunTable(sc, ages, *requests, *seed)
		t.Write(e.stdout)
		tables = append(tables, t)
	}
	if *plotPath != "" {
		var png bytes.Buffer
		if err := routeplot.WritePNG(&png, tables); err != nil {
			return err
		}
		if err := os.WriteFile(*plotPath, png.Bytes(), 0o644); err != nil {
			return fmt.Errorf("bench routing: %w", err)
		}
		fmt.Fprintf(e.stdout, "wrote %s\n", *plotPath)
	}
	if *sweep {
		for _, sc := range []routesim.Scenario{routesim.Scenarios[0], routesim.Scenarios[3]} {
			routesim.WriteSweep(e.stdout, sc.Slots, sc.Lognormal, routesim.SweepLoads, routesim.SweepGateways, ages, *requests, *seed)
		}
	}
	return nil
}
