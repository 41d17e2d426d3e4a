package operator

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/signals"
)

// refreshingBackend recomputes a gauge every period from its phase: the
// value it serves is the count of recomputations that changed it, and
// every changeEvery-th recomputation changes it (1: each; 0: none, an idle
// pool). At shiftAt its phase moves to shiftedPhase (a restart).
type refreshingBackend struct {
	epoch                time.Time
	period, phase        time.Duration
	changeEvery          int
	shiftAt              time.Duration
	shiftedPhase         time.Duration
	scrapeTook           time.Duration
	scrapes, probeScrape int
}

// lastRefresh is the instant of the latest recomputation at or before t,
// and its index.
func (b *refreshingBackend) lastRefresh(t time.Time) (time.Time, int64) {
	phase := b.phase
	since := t.Sub(b.epoch)
	if b.shiftAt > 0 && since >= b.shiftAt {
		phase = b.shiftedPhase
	}
	k := (since - phase) / b.period
	if since < phase {
		k = -1
	}
	return b.epoch.Add(phase + k*b.period), int64(k)
}

// serve is what a scrape that started at start serves: it is computed
// halfway through the scrape.
func (b *refreshingBackend) serve(start time.Time) (gauges poolGauges, computed time.Time) {
	computed, k := b.lastRefresh(start.Add(b.scrapeTook / 2))
	if b.changeEvery == 0 {
		return poolGauges{running: 7}, computed
	}
	if b.shiftAt > 0 && computed.Sub(b.epoch) >= b.shiftAt {
		k += 1 << 20 // a restarted backend's values differ from before
	}
	return poolGauges{running: float64(k / int64(b.changeEvery))}, computed
}

// drive runs a provider's scrape schedule (as scrapeLoop does) against b
// for d, and calls tick for every publishing scrape with its start, the
// stamp it would carry and when what it served was computed.
func drive(b *refreshingBackend, interval, d time.Duration, tick func(start, stamp, computed time.Time, ph *refreshPhase)) *refreshPhase {
	ph := newRefreshPhase(b.period)
	scrape := func(at time.Time, probe bool) {
		gauges, _ := b.serve(at)
		ph.observe(at, at.Add(b.scrapeTook), gauges, true, probe)
	}
	t := b.epoch.Add(scrapeOffset("p", interval))
	for t.Sub(b.epoch) < d {
		scrape(t, false)
		b.scrapes++
		_, computed := b.serve(t)
		tick(t, ph.servedAt(t), computed, ph)
		end := t.Add(b.scrapeTook)
		next := ph.nextTick(t, interval)
		if at, ok := ph.probeBefore(next); ok && at.After(end) && at.Before(next) {
			scrape(at, true)
			b.probeScrape++
			next = ph.nextTick(t, interval)
		}
		t = maxTime(next, end)
	}
	return ph
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestRefreshPhaseIsLearnt: scrapes land just after each recomputation once
// its phase is learnt, and every reading is stamped within a goal's width
// of when its values were computed, where a blind scrape's stamp (half a
// period before it) is off by up to half a period.
func TestRefreshPhaseIsLearnt(t *testing.T) {
	epoch := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name             string
		period, interval time.Duration
		phase            time.Duration
		changeEvery      int
		took             time.Duration
		// learnt: the periods by which the window must be narrow.
		learnt int
	}{
		{"1s refresh, 1s scrapes", time.Second, time.Second, 370 * time.Millisecond, 1, 2 * time.Millisecond, 8},
		{"1s refresh, slow scrapes", time.Second, time.Second, 910 * time.Millisecond, 1, 15 * time.Millisecond, 10},
		{"values change every third refresh", time.Second, time.Second, 120 * time.Millisecond, 3, 2 * time.Millisecond, 24},
		{"the real EPP's 5s refresh, 1s scrapes", 5 * time.Second, time.Second, 3210 * time.Millisecond, 1, 2 * time.Millisecond, 10},
		{"1s refresh, 2s scrapes", time.Second, 2 * time.Second, 640 * time.Millisecond, 1, 2 * time.Millisecond, 16},
		{"200ms refresh, 1s scrapes", 200 * time.Millisecond, time.Second, 50 * time.Millisecond, 1, 2 * time.Millisecond, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &refreshingBackend{epoch: epoch, period: tc.period, phase: tc.phase, changeEvery: tc.changeEvery, scrapeTook: tc.took}
			goal := phaseGoal(tc.period)
			learnt := epoch.Add(time.Duration(tc.learnt) * tc.period)
			var ticks, late int
			var worst, blindWorst time.Duration
			var last time.Time
			ph := drive(b, tc.interval, time.Duration(tc.learnt+40)*tc.period, func(start, stamp, computed time.Time, ph *refreshPhase) {
				if start.Before(learnt) {
					return
				}
				ticks++
				worst = max(worst, (stamp.Sub(computed)).Abs())
				blindWorst = max(blindWorst, start.Add(-tc.period/2).Sub(computed).Abs())
				// A tick that follows a recomputation follows it closely.
				if tc.interval >= tc.period && start.Sub(computed) > goal+phaseMargin+3*tc.took {
					late++
				}
				if gap := start.Sub(last); !last.IsZero() && tc.interval >= tc.period && (gap < tc.interval-tc.period/2 || gap > tc.interval+tc.period/2) {
					t.Errorf("ticks %v apart, want about %v", gap, tc.interval)
				}
				last = start
			})
			if !ph.known() {
				t.Fatalf("window %v wide after %d periods, want at most %v", ph.width, tc.learnt+40, goal)
			}
			if ticks == 0 {
				t.Fatal("no tick after the window was learnt")
			}
			if worst > goal/2+2*tc.took {
				t.Errorf("stamps off by up to %v, want at most %v (blind: %v)", worst, goal/2+2*tc.took, blindWorst)
			}
			if late > 0 {
				t.Errorf("%d of %d ticks more than %v after the recomputation they served", late, ticks, goal+phaseMargin+3*tc.took)
			}
			if ph.relearned != 0 {
				t.Errorf("window relearnt %d times with a steady backend", ph.relearned)
			}
			t.Logf("%d scrapes, %d probes; stamps off by ≤ %v (blind ≤ %v)", b.scrapes, b.probeScrape, worst, blindWorst)
		})
	}
}

// TestRefreshPhaseFollowsARestart: a backend whose recomputations move (a
// restart) is relearnt, and its stamps are right again.
func TestRefreshPhaseFollowsARestart(t *testing.T) {
	epoch := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	for _, interval := range []time.Duration{time.Second, 2 * time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			b := &refreshingBackend{epoch: epoch, period: time.Second, phase: 300 * time.Millisecond, changeEvery: 1,
				scrapeTook: 2 * time.Millisecond, shiftAt: 20 * time.Second, shiftedPhase: 140 * time.Millisecond}
			var worst time.Duration
			ph := drive(b, interval, 60*time.Second, func(start, stamp, computed time.Time, _ *refreshPhase) {
				if start.Sub(epoch) > 40*time.Second {
					worst = max(worst, stamp.Sub(computed).Abs())
				}
			})
			if ph.relearned == 0 {
				t.Error("the moved recomputations were never seen")
			}
			if !ph.known() || worst > phaseGoal(time.Second)/2+4*time.Millisecond {
				t.Errorf("after the restart: window %v, stamps off by up to %v", ph.width, worst)
			}
		})
	}
}

// TestRefreshPhaseIdleStaysBlind: values that never change say nothing of
// when they are recomputed; readings are then stamped half a period back,
// as a blind scrape's, and the scrapes keep the interval.
func TestRefreshPhaseIdleStaysBlind(t *testing.T) {
	epoch := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	b := &refreshingBackend{epoch: epoch, period: time.Second, phase: 500 * time.Millisecond, scrapeTook: 2 * time.Millisecond}
	ph := drive(b, time.Second, 30*time.Second, func(start, stamp, _ time.Time, _ *refreshPhase) {
		if want := start.Add(-500 * time.Millisecond); !stamp.Equal(want) {
			t.Fatalf("stamp %v before the scrape, want 500ms", start.Sub(stamp))
		}
	})
	if ph.width != time.Second {
		t.Errorf("window %v, want the whole period", ph.width)
	}
	if b.scrapes < 29 || b.scrapes > 31 {
		t.Errorf("%d scrapes in 30 s at 1 s", b.scrapes)
	}
}

// TestRefreshPhaseNarrow: the window's intersection with a bracket, in
// each way they can meet.
func TestRefreshPhaseNarrow(t *testing.T) {
	base := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		from, width, lo, hi int // ms from base; the period is 1000
		wantFrom, wantWidth int
		relearned           bool
	}{
		{0, 1000, 200, 700, 200, 500, false},    // inside
		{0, 400, 300, 800, 300, 100, false},     // overlapping its end
		{500, 400, 1600, 1950, 600, 300, false}, // a later period
		{500, 400, 1300, 1700, 500, 200, false}, // a later period, overlapping its start
		{800, 400, 900, 1300, 900, 300, false},  // window wrapping past the period's end
		{100, 200, 500, 900, 500, 400, true},    // missed: replaced
		{0, 900, 700, 1200, 0, 900, false},      // meets it twice: unchanged
	} {
		t.Run(fmt.Sprintf("%d+%d∩(%d,%d]", tc.from, tc.width, tc.lo, tc.hi), func(t *testing.T) {
			ph := &refreshPhase{period: time.Second, from: base.Add(ms(tc.from)), width: ms(tc.width), started: true}
			ph.narrow(base.Add(ms(tc.lo)), base.Add(ms(tc.hi)))
			gotFrom := mod(ph.from.Sub(base), time.Second)
			if gotFrom != mod(ms(tc.wantFrom), time.Second) || ph.width != ms(tc.wantWidth) || (ph.relearned > 0) != tc.relearned {
				t.Errorf("window (%v, +%v], relearned %d; want (%v, +%v], relearned %v", gotFrom, ph.width, ph.relearned, ms(tc.wantFrom), ms(tc.wantWidth), tc.relearned)
			}
		})
	}
}

// TestRefreshPhaseOnARealScrapeLoop: an operator scraping, on the real
// clock and over HTTP, an EPP that recomputes its pool gauges every 200 ms
// at a phase of its own learns the phase and stamps what it publishes with
// the instant it was computed; stamped half a period before each scrape,
// readings were off by up to 100 ms either way.
func TestRefreshPhaseOnARealScrapeLoop(t *testing.T) {
	const period = 200 * time.Millisecond
	epoch := time.Now().Add(-73 * time.Millisecond) // a recomputation at epoch + k·period
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		k := time.Since(epoch) / period
		fmt.Fprintf(w, "inference_pool_ready_pods{name=\"p\"} 2\ninference_pool_average_running_requests{name=\"p\"} %d\ninference_pool_average_queue_size{name=\"p\"} 0\n", k)
	}))
	t.Cleanup(srv.Close)
	pc := providerConf("pool", "epp", srv.URL)
	pc.Metrics.PoolName = "p"
	pc.Metrics.RefreshInterval = config.Duration(period)
	cfg, err := config.ParseOperator("test", mustYAML(t, &config.Operator{Site: "east", StateDir: t.TempDir(), Providers: []config.Provider{pc}}))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ScrapeInterval = config.Duration(period)
	state, err := OpenState(cfg.StateDir, time.Now().UnixMilli(), cfg.Providers, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := New(cfg, state, Options{Clock: clock.Real{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { op.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	p, _ := op.providers.Load("pool")
	prov := p.(*provider)
	known := func() bool {
		prov.mu.Lock()
		defer prov.mu.Unlock()
		return prov.phase != nil && prov.phase.known()
	}
	t.Logf("learnt in %v", waitFor(t, 30*time.Second, "the refresh phase to be learnt", known))
	// Ten readings in a row, each stamped where its values were computed.
	var seen int
	last := int64(-1)
	waitFor(t, 30*time.Second, "ten readings after the phase was learnt", func() bool {
		for _, e := range op.SiteStore().Current(time.Now()) {
			for _, r := range e.Rows {
				if r.Name != signals.InFlight {
					continue
				}
				k := int64(r.Value) / 2
				if k == last {
					continue
				}
				last = k
				computed := epoch.Add(time.Duration(k) * period)
				if off := e.CollectedAt.Sub(computed).Abs(); off > 25*time.Millisecond {
					t.Errorf("reading of the recomputation at %v stamped %v off", computed.Sub(epoch), off)
				}
				seen++
			}
		}
		return seen >= 10
	})
}
