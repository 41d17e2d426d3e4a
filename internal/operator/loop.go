package operator

import (
	"context"
	"hash/fnv"
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

// scrapeLoops runs one scrape loop per provider (scrapeLoop), as
// Prometheus's scrape pool runs one per target: a provider that hangs to
// its timeout delays only its own next scrape. Loops are started and
// stopped as reloads add and remove providers (sync). All loops share one
// bound on scrapes in flight, scrapeConcurrency.
type scrapeLoops struct {
	o *Operator
	// mu guards ctx, running and sem; Run and Reload's goroutines.
	mu sync.Mutex
	// ctx is Run's, nil before Run and after it returned.
	ctx     context.Context
	running map[*provider]context.CancelFunc
	wg      sync.WaitGroup
	// sem bounds the scrapes in flight. A reload that changes
	// scrapeConcurrency replaces it; a scrape returns its token to the
	// one it took it from.
	sem      chan struct{}
	semLimit int
}

func newScrapeLoops(o *Operator) *scrapeLoops {
	return &scrapeLoops{o: o, running: map[*provider]context.CancelFunc{}}
}

// run starts a loop for every provider and keeps them until ctx ends, then
// waits for every loop to return.
func (l *scrapeLoops) run(ctx context.Context) {
	l.mu.Lock()
	l.ctx = ctx
	l.mu.Unlock()
	l.sync()
	<-ctx.Done()
	l.mu.Lock()
	l.ctx = nil
	l.mu.Unlock()
	l.wg.Wait()
}

// sync starts a loop for each provider that has none and stops the loops
// of providers gone; nothing before run.
func (l *scrapeLoops) sync() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		return
	}
	if n := l.o.cfg.Load().ScrapeConcurrency; l.sem == nil || n != l.semLimit {
		l.sem, l.semLimit = make(chan struct{}, max(n, 1)), n
	}
	live := map[*provider]bool{}
	l.o.providers.Range(func(_, v any) bool {
		p := v.(*provider)
		live[p] = true
		if _, ok := l.running[p]; !ok {
			ctx, cancel := context.WithCancel(l.ctx)
			l.running[p] = cancel
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.o.scrapeLoop(ctx, p, l.acquire)
			}()
		}
		return true
	})
	for p, cancel := range l.running {
		if !live[p] {
			cancel()
			delete(l.running, p)
		}
	}
}

// acquire takes a place among the scrapes in flight, waiting while all are
// taken; release gives it back. ok is false when ctx ended first.
func (l *scrapeLoops) acquire(ctx context.Context) (release func(), ok bool) {
	l.mu.Lock()
	sem := l.sem
	l.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, true
	case <-ctx.Done():
		return nil, false
	}
}

// scrapeOffset is where in its interval a provider's scrapes fall: fixed
// by its name, so the providers' scrapes spread over the interval instead
// of starting together, and a restarted operator keeps each provider's
// phase (Prometheus offsets each target by a hash of it the same way).
func scrapeOffset(name string, interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	return time.Duration(h.Sum64() % uint64(interval))
}

// scrapeLoop scrapes p at its own interval (config.Operator.ScrapeIntervalOf)
// from its offset, until ctx ends or a reload removes p; a provider that
// recomputes its gauges on a period (metrics.refreshInterval) is scraped
// just after each recomputation once its phase is learnt, with a probe
// scrape before it (provider.plan). Each scrape waits for a place among
// the scrapes in flight (acquire), and the time from its tick to its end
// is p's cycle, which the next scrape's readiness floor reads. A scrape
// that runs past the interval delays only p's next one; ticks never
// burst.
func (o *Operator) scrapeLoop(ctx context.Context, p *provider, acquire func(context.Context) (func(), bool)) {
	interval := func() time.Duration { return o.cfg.Load().ScrapeIntervalOf(p.currentConfig()) }
	if !clock.Sleep(ctx, o.clk, scrapeOffset(p.cfg.Name, interval())) {
		return
	}
	scrape := func(probe bool) (more bool) {
		release, ok := acquire(ctx)
		if !ok {
			return false
		}
		defer release()
		return !o.scrape(ctx, p, probe) && ctx.Err() == nil
	}
	for {
		tick := o.clk.Now()
		if !scrape(false) {
			return
		}
		p.cycle.Store(int64(o.clk.Now().Sub(tick)))
		next, probe := p.plan(tick, o.clk.Now(), interval())
		if !probe.IsZero() {
			if !clock.Sleep(ctx, o.clk, probe.Sub(o.clk.Now())) || !scrape(true) {
				return
			}
			// The probe may have moved the window.
			next, _ = p.plan(tick, o.clk.Now(), interval())
		}
		if !clock.Sleep(ctx, o.clk, next.Sub(o.clk.Now())) {
			return
		}
	}
}
