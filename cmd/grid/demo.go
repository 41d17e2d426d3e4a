package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"

	"github.com/grid-inference/grid/internal/demo"
)

func runDemo(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("demo", e)
	var o demo.Options
	fs.DurationVar(&o.Duration, "duration", 0, "end after this long and print a summary (0: until Ctrl-C)")
	fs.IntVar(&o.Sites, "sites", 3, "how many sites (1 to 3)")
	fs.Float64Var(&o.Rate, "rate", 0, "requests per second (0: 70% of the grid's capacity)")
	fs.BoolVar(&o.NoStory, "no-story", false, "skip the scripted burst, outage and overload")
	verbose := fs.Bool("verbose", false, "log what every component does (to stderr, under the view)")
	if err := parseFlags(e, fs, args); err != nil {
		return err
	}
	switch {
	case o.Duration < 0:
		return fmt.Errorf("%w: --duration must not be negative (0 runs until Ctrl-C), got %v", errUsage, o.Duration)
	case o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0):
		return fmt.Errorf("%w: --rate must be a finite number of requests per second, 0 or more (0: 70%% of capacity), got %v", errUsage, o.Rate)
	}
	o.Out = e.stdout
	o.Log = slog.New(slog.DiscardHandler)
	if *verbose {
		o.Log = e.log
	}
	return demo.Run(ctx, o)
}
