package operator

import (
	"context"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
)

// every runs round, then waits for the next tick of a ticker whose period
// is read from period after each round, until ctx ends. A round that runs
// long delays the next one; ticks never burst.
func every(ctx context.Context, clk clock.Clock, period func() time.Duration, round func()) {
	interval := period()
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		round()
		if d := period(); d != interval {
			interval = d
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// forEachBounded calls fn for every item, at most limit at a time, and
// returns when all calls have returned. Items not started when ctx ends are
// skipped.
func forEachBounded[T any](ctx context.Context, limit int, items []T, fn func(T)) {
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, it := range items {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(it)
		}()
	}
}
