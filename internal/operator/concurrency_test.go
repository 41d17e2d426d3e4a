package operator

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/readiness"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/sim"
)

// heldScrapes is a metrics endpoint whose answers wait until released,
// counting the scrapes in flight and the most seen at once.
type heldScrapes struct {
	inFlight, most, served atomic.Int64
	release                chan struct{}
	once                   sync.Once
}

func newHeldScrapes(t *testing.T) (*heldScrapes, string) {
	h := &heldScrapes{release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.inFlight.Add(1)
		for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
		}
		select {
		case <-h.release:
		case <-r.Context().Done():
		}
		h.inFlight.Add(-1)
		h.served.Add(1)
		fmt.Fprintln(w, `llm_d_epp_ready_endpoints{name="p"} 1`)
	}))
	t.Cleanup(func() { h.let(); srv.Close() })
	return h, srv.URL
}

func (h *heldScrapes) let() { h.once.Do(func() { close(h.release) }) }

// TestScrapesInFlightAreBounded: with 40 providers whose scrapes hang, at
// most scrapeConcurrency (16, the default) are in flight at once, in the
// per-provider loops of Run and in a driven Pass alike; the others wait
// their turn and are scraped once places free up.
func TestScrapesInFlightAreBounded(t *testing.T) {
	for _, mode := range []string{"loops", "pass"} {
		t.Run(mode, func(t *testing.T) {
			held, url := newHeldScrapes(t)
			var ps []config.Provider
			for i := range 40 {
				p := providerConf(fmt.Sprintf("p%02d", i), "epp", url)
				p.Metrics.Timeout = config.Duration(time.Minute)
				ps = append(ps, p)
			}
			h := newHarness(t, ps...)
			if got := h.cfg.ScrapeConcurrency; got != 16 {
				t.Fatalf("default scrapeConcurrency %d, want 16", got)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				if mode == "loops" {
					h.op.Run(ctx)
				} else {
					h.op.Pass(ctx)
				}
			}()
			defer func() { held.let(); cancel(); <-done }()
			if mode == "loops" {
				// Past every provider's offset in its 1 s interval: all 40
				// loops want to scrape now (those of offset 0 already do).
				waitFor(t, 20*time.Second, "the loops to wait on the fake clock", func() bool { return h.clk.Waiters()+int(held.inFlight.Load()) >= 40 })
				h.clk.Advance(time.Second)
			}
			waitFor(t, 20*time.Second, "16 scrapes in flight", func() bool { return held.inFlight.Load() == 16 })
			// What must not happen: a 17th scrape starting. Each of the
			// 40 is runnable now; give them time to try.
			time.Sleep(300 * time.Millisecond)
			if n, most := held.inFlight.Load(), held.most.Load(); n != 16 || most != 16 {
				t.Fatalf("%d scrapes in flight, %d at most: want 16, the bound", n, most)
			}
			held.let()
			waitFor(t, 20*time.Second, "every provider scraped", func() bool { return held.served.Load() >= 40 })
			if most := held.most.Load(); most > 16 {
				t.Errorf("%d scrapes were in flight at once, want at most 16", most)
			}
		})
	}
}

// TestStaleWindowReadsTheMeasuredCycle: the stale window never falls below
// one interval plus the provider's latest measured scrape cycle, and the
// operator feeds it the cycle it measured. A provider whose scrape took 5 s
// (of fake time: its metrics endpoint advances the clock while answering)
// and whose next scrape fails 4 s after the good sample is still ready with
// a configured staleAfter of 1 s: its window is 1 s + 5 s. Read with a
// cycle of 0, the window would be 2 s and the provider down.
func TestStaleWindowReadsTheMeasuredCycle(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindEPP})
	var h *harness
	var fail atomic.Bool
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			h.clk.Advance(time.Second)
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		h.clk.Advance(5 * time.Second) // a scrape that takes 5 s
		b.Handler().ServeHTTP(w, r)
	}))
	defer slow.Close()
	p := providerConf("pool-a", "epp", slow.URL)
	p.Metrics.StaleAfter = config.Duration(time.Second)
	h = newHarness(t, p)
	h.op.Pass(context.Background())
	h.op.Pass(context.Background()) // the cycle of this one (5 s) is read by the next
	if v := h.op.Verdicts()["pool-a"]; v.Reason != readiness.Ready {
		t.Fatalf("after two good scrapes: %+v", v)
	}
	fail.Store(true)
	h.clk.Advance(3 * time.Second) // the next tick, late: 4 s after the sample with the failing scrape
	h.op.Pass(context.Background())
	if v := h.op.Verdicts()["pool-a"]; v.Reason != readiness.Ready {
		t.Errorf("4 s after a good sample, with a 5 s scrape cycle: %+v; want still ready (window 1 s + 5 s)", v)
	}
	h.clk.Advance(3 * time.Second) // 8 s after the sample: past 1 s + the cycle
	h.op.Pass(context.Background())
	if v := h.op.Verdicts()["pool-a"]; v.Reason == readiness.Ready {
		t.Errorf("8 s after the last good sample: %+v; want down", v)
	}
}

// TestLoadsAbsenceRememberedOnlyWhenReady: an engine whose /v1/loads
// answered 404 on its very first scrape (warming up) and 200 afterwards is
// read through /v1/loads from its second scrape on: an absence is
// remembered only of a provider judged ready. Once ready, a 404 is
// remembered.
func TestLoadsAbsenceRememberedOnlyWhenReady(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindSGLang})
	var loads atomic.Int64
	var absent atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/loads" {
			if n := loads.Add(1); n == 1 || absent.Load() {
				http.NotFound(w, r) // warming up, or gone for good
				return
			}
		}
		b.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	h := newHarness(t, providerConf("engine", "sglang", srv.URL))
	target := h.op.providerTarget("engine").LoadsURL
	h.pass()
	if h.op.memo.Absent(target) {
		t.Fatal("a 404 on the first scrape, before any verdict, was remembered as absent")
	}
	h.pass()
	h.pass()
	if n := loads.Load(); n != 3 {
		t.Errorf("/v1/loads asked %d times in three scrapes, want every scrape once it answers", n)
	}
	if v := h.op.Verdicts()["engine"]; v.Reason != readiness.Ready {
		t.Fatalf("verdict %+v", v)
	}
	absent.Store(true)
	h.pass()
	if !h.op.memo.Absent(target) {
		t.Error("a 404 from a ready engine was not remembered")
	}
}

// TestScrapedSiteLabelsAreExported: a backend whose series carry grid_site
// or grid_provider labels of their own cannot speak for another site or
// provider: the operator moves them to exported_grid_site and
// exported_grid_provider and sets the two itself (docs/protocol.md §4.6).
func TestScrapedSiteLabelsAreExported(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindEPP})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		b.Handler().ServeHTTP(rec, r)
		body := strings.ReplaceAll(rec.Body.String(), `{name="`, `{grid_site="west",grid_provider="evil",name="`)
		w.Write([]byte(body))
	}))
	defer srv.Close()
	p := providerConf("pool-a", "epp", srv.URL)
	h := newHarness(t, p)
	h.pass()
	body := string(h.op.signalsAnswer(h.clk.Now(), selection{}, true, signals.Cursor{}).body)
	if !strings.Contains(body, `exported_grid_site="west"`) || !strings.Contains(body, `exported_grid_provider="evil"`) {
		t.Fatalf("the scraped labels were not exported:\n%s", body)
	}
	if strings.Contains(strings.ReplaceAll(body, `exported_grid_site="west"`, ""), `grid_site="west"`) {
		t.Errorf("a row speaks for west:\n%s", body)
	}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "llm_d_epp_") && (!strings.Contains(l, `,grid_site="east"`) && !strings.Contains(l, `{grid_site="east"`) || strings.Count(l, `grid_provider="pool-a"`) != 1) {
			t.Errorf("a relayed row not attributed to east/pool-a: %s", l)
		}
	}
}

// TestProviderScrapeFailuresAreSaidOnce: a provider whose scrapes start
// failing is said at WARN once, naming it and the failure class, not at
// every scrape; its first good scrape after is one INFO.
func TestProviderScrapeFailuresAreSaidOnce(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindEPP})
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		b.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	var logged syncBuffer
	log := slog.New(slog.NewJSONHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := newHarnessWith(t, Options{Logger: log}, providerConf("pool-a", "epp", srv.URL))
	count := func(level, msg string) int {
		return strings.Count(logged.String(), `"level":"`+level+`","msg":"`+msg+`"`)
	}
	h.pass()
	down.Store(true)
	for range 3 {
		h.pass()
	}
	if n := count("WARN", "provider scrape failed"); n != 1 {
		t.Fatalf("three failed scrapes logged %d WARNs, want 1:\n%s", n, logged.String())
	}
	if !strings.Contains(logged.String(), `"provider":"pool-a"`) || !strings.Contains(logged.String(), `"class":"http"`) {
		t.Errorf("the WARN does not name the provider and the class:\n%s", logged.String())
	}
	down.Store(false)
	h.pass()
	h.pass()
	if n := count("INFO", "provider scrape succeeded again"); n != 1 {
		t.Errorf("recovery logged %d INFOs, want 1:\n%s", n, logged.String())
	}
}
