package operator

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/readiness"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backendSim is an in-process grid sim on loopback.
type backendSim struct {
	*sim.Sim
	URL string
}

func startSim(t *testing.T, o sim.Options) *backendSim {
	t.Helper()
	if o.RefreshInterval == 0 {
		o.RefreshInterval = 20 * time.Millisecond
	}
	if o.TTFT == 0 {
		o.TTFT = 20 * time.Millisecond
	}
	if o.TPOT == 0 {
		o.TPOT = 20 * time.Millisecond
	}
	s, err := sim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	return &backendSim{s, srv.URL}
}

func (b *backendSim) control(t *testing.T, body string) {
	t.Helper()
	resp, err := http.Post(b.URL+"/sim/control", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("control %s: %s", body, b)
	}
}

// awaitMetric waits until the sim's /metrics has a sample of name whose
// value is v: the EPP's pool gauges follow a control change at its next
// refresh, which a busy machine delays.
func (b *backendSim) awaitMetric(t *testing.T, name string, v float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(b.URL + "/metrics")
		if err == nil {
			p := expfmt.NewTextParser(model.UTF8Validation)
			mfs, perr := p.TextToMetricFamilies(resp.Body)
			resp.Body.Close()
			if mf := mfs[name]; perr == nil && mf != nil && len(mf.Metric) > 0 && mf.Metric[0].GetGauge().GetValue() == v {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sim's %s never read %v", name, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// load starts n streaming requests of tokens each and returns a wait func.
func (b *backendSim) load(t *testing.T, n, tokens int) func() {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(b.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"stream":true}`, sim.DefaultModel, tokens)))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	return wg.Wait
}

// harness is an operator on a fake clock whose passes the test drives.
type harness struct {
	t   *testing.T
	op  *Operator
	clk *clock.Fake
	cfg *config.Operator
}

func newHarness(t *testing.T, ps ...config.Provider) *harness {
	t.Helper()
	return newHarnessWith(t, Options{}, ps...)
}

// newHarnessWith is newHarness with the operator's options (a logger);
// the clock is the harness's.
func newHarnessWith(t *testing.T, opts Options, ps ...config.Provider) *harness {
	t.Helper()
	cfg := &config.Operator{Site: "east", StateDir: t.TempDir(), Providers: ps}
	cfg, err := config.ParseOperator("test", mustYAML(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	state, err := OpenState(cfg.StateDir, clk.Now().UnixMilli(), cfg.Providers, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opts.Clock = clk
	op, err := New(cfg, state, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Close)
	return &harness{t: t, op: op, clk: clk, cfg: cfg}
}

func providerConf(name, kind, url string) config.Provider {
	return config.Provider{Name: name, Model: sim.DefaultModel, Kind: kind, Upstream: url,
		Metrics: config.Metrics{Endpoint: url, Timeout: config.Duration(300 * time.Millisecond)}}
}

// pass advances the clock one interval and runs a scrape pass, after giving
// the sims' EPP refresh a moment of real time.
func (h *harness) pass() {
	time.Sleep(60 * time.Millisecond)
	h.clk.Advance(time.Second)
	h.op.Pass(context.Background())
}

// scrapeMetrics reads the operator's /metrics.
func (h *harness) scrapeMetrics() map[string]*dto.MetricFamily {
	h.t.Helper()
	rec := httptest.NewRecorder()
	h.op.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		h.t.Fatal(err)
	}
	return fams
}

// gauge returns a grid_provider_* value for a provider, or -1 when absent.
func (h *harness) gauge(name, prov string) float64 {
	f := h.scrapeMetrics()[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if l.GetName() == signals.LabelProvider && l.GetValue() == prov {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func (h *harness) scrapeCount(prov, result string) float64 {
	for _, m := range h.scrapeMetrics()["grid_provider_scrape_total"].GetMetric() {
		var p, r string
		for _, l := range m.Label {
			switch l.GetName() {
			case signals.LabelProvider:
				p = l.GetValue()
			case "result":
				r = l.GetValue()
			}
		}
		if p == prov && r == result {
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func TestOperatorAgainstEachSimKind(t *testing.T) {
	for _, kind := range []string{sim.KindEPP, sim.KindVLLM, sim.KindSGLang} {
		t.Run(kind, func(t *testing.T) {
			b := startSim(t, sim.Options{Kind: kind, Endpoints: 2, Slots: 2, TPOT: 50 * time.Millisecond})
			pkind := kind
			h := newHarness(t, providerConf("pool-a", pkind, b.URL))
			h.pass()
			if v := h.gauge(signals.Ready, "pool-a"); v != 1 {
				t.Fatalf("grid_provider_ready = %v", v)
			}
			wantEndpoints := 2.0
			if kind != sim.KindEPP {
				wantEndpoints = 1 // an engine is one ready endpoint
			}
			if v := h.gauge(signals.ReadyEndpoints, "pool-a"); v != wantEndpoints {
				t.Errorf("ready endpoints = %v, want %v", v, wantEndpoints)
			}
			if v := h.gauge(signals.InFlight, "pool-a"); v != 0 {
				t.Errorf("idle in-flight = %v", v)
			}
			// Six long requests on four slots: in-flight tracks the real load.
			wait := b.load(t, 6, 40)
			deadline := time.Now().Add(5 * time.Second)
			var inFlight float64
			for time.Now().Before(deadline) {
				h.pass()
				if inFlight = h.gauge(signals.InFlight, "pool-a"); inFlight == 6 {
					break
				}
			}
			if inFlight != 6 {
				t.Errorf("in-flight under six requests = %v", inFlight)
			}
			wait()
			if h.scrapeCount("pool-a", "success") < 2 {
				t.Errorf("success count %v", h.scrapeCount("pool-a", "success"))
			}
		})
	}
}

// TestEngineExtrasOnlyWhenKnown: the engine readings beyond running and
// waiting are exported when the engine's source gave them and absent
// otherwise: vLLM's /metrics gives the token usage only; SGLang's /v1/loads
// gives them all (its disaggregation block is there, zero, on a unified
// server).
func TestEngineExtrasOnlyWhenKnown(t *testing.T) {
	for _, tc := range []struct {
		kind        string
		have, lacks []string
	}{
		{sim.KindVLLM, []string{"grid_provider_engine_token_usage"},
			[]string{"grid_provider_engine_waiting_uncached_tokens", "grid_provider_engine_gen_throughput_tokens_per_second", "grid_provider_engine_prefill_queue_requests", "grid_provider_engine_decode_queue_requests"}},
		{sim.KindSGLang, []string{"grid_provider_engine_token_usage", "grid_provider_engine_waiting_uncached_tokens", "grid_provider_engine_gen_throughput_tokens_per_second",
			"grid_provider_engine_prefill_queue_requests", "grid_provider_engine_decode_queue_requests"}, nil},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			b := startSim(t, sim.Options{Kind: tc.kind, Endpoints: 1, Slots: 2})
			h := newHarness(t, providerConf("pool-a", tc.kind, b.URL))
			h.pass()
			h.pass()
			got := h.scrapeMetrics()
			for _, name := range tc.have {
				if got[name] == nil {
					t.Errorf("%s absent", name)
				}
			}
			for _, name := range tc.lacks {
				if got[name] != nil {
					t.Errorf("%s exported though the engine's source does not give it", name)
				}
			}
		})
	}
}

// TestMaxRunningRelayed: a unit's limit is relayed as configured, else as
// the engine declares it (SGLang's max_running_requests), else not at all.
func TestMaxRunningRelayed(t *testing.T) {
	for _, tc := range []struct {
		name, kind string
		configured int
		want       float64 // -1: absent
	}{
		{"sglang declares its slots", sim.KindSGLang, 0, 3},
		{"configured over declared", sim.KindSGLang, 5, 5},
		{"vllm configured", sim.KindVLLM, 4, 4},
		{"vllm says nothing", sim.KindVLLM, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startSim(t, sim.Options{Kind: tc.kind, Endpoints: 1, Slots: 3})
			pc := providerConf("pool-a", tc.kind, b.URL)
			pc.MaxRunning = tc.configured
			h := newHarness(t, pc)
			h.pass()
			if v := h.gauge(signals.MaxRunning, "pool-a"); v != tc.want {
				t.Errorf("%s = %v, want %v", signals.MaxRunning, v, tc.want)
			}
		})
	}
}

// TestEngineReplacedIsReprobed: a vLLM engine without /v1/loads is asked
// once and remembered; when its scrapes fail and then succeed again (the
// engine was restarted, perhaps upgraded), the absence is forgotten and the
// engine asked again, and that is counted.
func TestEngineReplacedIsReprobed(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindVLLM, Endpoints: 1, Slots: 2})
	h := newHarness(t, providerConf("pool-a", sim.KindVLLM, b.URL))
	h.pass()
	h.pass()
	if !h.op.memo.Absent(h.op.providerTarget("pool-a").LoadsURL) {
		t.Fatal("the engine's missing /v1/loads was not remembered")
	}
	b.control(t, `{"down": true}`)
	h.pass()
	if !h.op.memo.Absent(h.op.providerTarget("pool-a").LoadsURL) {
		t.Fatal("a failed scrape alone forgot the absence")
	}
	b.control(t, `{"down": false}`)
	h.pass()
	if h.op.memo.Absent(h.op.providerTarget("pool-a").LoadsURL) {
		t.Error("a good scrape after a failed one kept the absence")
	}
	if got := testutil.ToFloat64(h.op.m.reprobes.WithLabelValues("pool-a", reprobeRecovered)); got != 1 {
		t.Errorf("grid_provider_loads_reprobe_total{reason=recovered} = %v", got)
	}
}

// TestReadinessFollowsReadyEndpoints: the sim's readyEndpoints set to 0 with
// no engine answering turns grid_provider_ready to 0 within three scrapes,
// and back to 1 within two scrapes of recovery.
func TestReadinessFollowsReadyEndpoints(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindEPP, Endpoints: 2})
	h := newHarness(t, providerConf("pool-a", "epp", b.URL))
	h.pass()
	h.pass()
	if v := h.gauge(signals.Ready, "pool-a"); v != 1 {
		t.Fatalf("ready before = %v", v)
	}
	b.control(t, `{"readyEndpoints": 0}`)
	b.awaitMetric(t, signals.EPPReadyEndpoints, 0)
	scrapes := 0
	for ; scrapes < 3 && h.gauge(signals.Ready, "pool-a") != 0; scrapes++ {
		h.pass()
	}
	if h.gauge(signals.Ready, "pool-a") != 0 {
		t.Fatalf("still ready after 3 scrapes of 0 endpoints: %+v", h.op.Verdicts())
	}
	if v := h.op.Verdicts()["pool-a"]; v.Reason != readiness.NoEndpointsReady {
		t.Errorf("verdict %+v", v)
	}
	b.control(t, `{"readyEndpoints": null}`)
	b.awaitMetric(t, signals.EPPReadyEndpoints, 2)
	scrapes = 0
	for ; scrapes < 2 && h.gauge(signals.Ready, "pool-a") != 1; scrapes++ {
		h.pass()
	}
	if h.gauge(signals.Ready, "pool-a") != 1 {
		t.Fatalf("not ready 2 scrapes after recovery: %+v", h.op.Verdicts())
	}
	t.Logf("excluded and rejoined within the bounds")
}

// TestFaultyProvidersDoNotDisturbOthers: a body over 1 MiB, a hung
// endpoint and garbage text each leave the operator serving the others.
func TestFaultyProvidersDoNotDisturbOthers(t *testing.T) {
	good := startSim(t, sim.Options{Kind: sim.KindEPP})
	big := startSim(t, sim.Options{Kind: sim.KindEPP})
	big.control(t, `{"oversize": true}`)
	hung := startSim(t, sim.Options{Kind: sim.KindEPP})
	hung.control(t, `{"metricsHang": true}`)
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("<html>}}}{{{ not prometheus \x01\x02 at all\n=== 1 2 3 4\n"))
	}))
	defer garbage.Close()
	h := newHarness(t,
		providerConf("good", "epp", good.URL), providerConf("big", "epp", big.URL),
		providerConf("hung", "epp", hung.URL), providerConf("garbage", "epp", garbage.URL))

	start := time.Now()
	for range 20 { // 20 fake seconds: past the 15s stale window
		h.pass()
	}
	if elapsed := time.Since(start); elapsed > 20*time.Second {
		t.Errorf("20 passes took %v: the hung provider held the others back", elapsed)
	}
	if v := h.gauge(signals.Ready, "good"); v != 1 {
		t.Errorf("good: ready %v", v)
	}
	if v := h.gauge(signals.ReadyEndpoints, "good"); v != 1 {
		t.Errorf("good: endpoints %v", v)
	}
	verdicts := h.op.Verdicts()
	for name, want := range map[string]readiness.Reason{
		"good": readiness.Ready, "big": readiness.NoLivenessCheck, "hung": readiness.ScrapeTimedOut, "garbage": readiness.NoLivenessCheck,
	} {
		if verdicts[name].Reason != want {
			t.Errorf("%s: verdict %+v, want %s", name, verdicts[name], want)
		}
	}
	if h.scrapeCount("big", "body_cap") < 1 || h.scrapeCount("hung", "timeout") < 1 || h.scrapeCount("garbage", "no_series") < 1 {
		t.Errorf("counters: big body_cap %v, hung timeout %v, garbage no_series %v",
			h.scrapeCount("big", "body_cap"), h.scrapeCount("hung", "timeout"), h.scrapeCount("garbage", "no_series"))
	}
	if v := h.gauge(signals.Ready, "hung"); v != 0 {
		t.Errorf("hung: ready %v, want 0 after the stale window", v)
	}
	// body_cap leaves readiness unknown: not declared down.
	if v := h.gauge(signals.Ready, "big"); v != 1 {
		t.Errorf("big: ready %v, want 1 (unknown does not exclude)", v)
	}
	// A series not held is absent, not 0.
	if v := h.gauge(signals.InFlight, "big"); v != -1 {
		t.Errorf("big: in-flight %v, want absent", v)
	}
}

func TestBatchMetadata(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindEPP, Endpoints: 2})
	h := newHarness(t, providerConf("pool-a", "epp", b.URL))
	h.pass()
	first := batchLine(t, h)
	h.pass()
	second := batchLine(t, h)
	rev := h.op.state.Revision("pool-a")
	for _, want := range []string{`provider_uid="` + rev.UID + `"`, fmt.Sprintf(`publisher_epoch="%d"`, h.op.Epoch()), `grid_site="east"`, `grid_provider="pool-a"`} {
		if !strings.Contains(first, want) {
			t.Errorf("batch line %s lacks %s", first, want)
		}
	}
	if first == second || !strings.Contains(second, `batch_sequence="2"`) {
		t.Errorf("sequence did not rise: %s then %s", first, second)
	}
	// batch_samples counts the batch's other rows.
	entry := h.op.SiteStore().Current(h.clk.Now())[0]
	if want := fmt.Sprintf(`batch_samples="%d"`, len(entry.Rows)-1); !strings.Contains(second, want) {
		t.Errorf("batch line %s, want %s", second, want)
	}
	for _, row := range entry.Rows {
		if site, _ := row.Label(signals.LabelSite); site != "east" {
			t.Errorf("row %s not attributed: %v", row.Name, row.Labels)
		}
	}
}

// TestRefreshIntervalAgesTheReading: a backend that recomputes its gauges
// every refreshInterval (the EPP) served, on average, values half of it
// old, and its reading is stamped so; a backend whose gauges are live is
// stamped at the scrape.
func TestRefreshIntervalAgesTheReading(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindEPP, Endpoints: 2})
	live := providerConf("live", "epp", b.URL)
	refreshed := providerConf("refreshed", "epp", b.URL)
	refreshed.Metrics.RefreshInterval = config.Duration(4 * time.Second)
	h := newHarness(t, live, refreshed)
	h.pass()
	now := h.clk.Now()
	ages := map[string]time.Duration{}
	for _, e := range h.op.SiteStore().Current(now) {
		ages[e.Target] = now.Sub(e.CollectedAt)
	}
	if ages["live"] != 0 || ages["refreshed"] != 2*time.Second {
		t.Errorf("reading ages at the scrape: %v, want live 0s and refreshed 2s", ages)
	}
}

func batchLine(t *testing.T, h *harness) string {
	t.Helper()
	for _, e := range h.op.SiteStore().Current(h.clk.Now()) {
		for i := range e.Rows {
			if e.Rows[i].Name == signals.ConfigGeneration {
				return string(signals.AppendLine(nil, &e.Rows[i], e.StampMs(h.clk.Now())))
			}
		}
	}
	t.Fatal("no batch metadata line")
	return ""
}

func TestReloadRevisionsAndForgetting(t *testing.T) {
	b := startSim(t, sim.Options{Kind: sim.KindVLLM})
	h := newHarness(t, providerConf("a", "vllm", b.URL), providerConf("gone", "vllm", b.URL))
	// The first scrape gives the verdict; a ready engine's 404 is
	// remembered from the second.
	h.pass()
	h.pass()
	if h.op.memo.Len() != 1 { // vLLM has no /v1/loads: memoized once for the shared URL
		t.Fatalf("memo %d", h.op.memo.Len())
	}
	genA := h.op.state.Revision("a").Generation
	next := *h.cfg
	next.Providers = []config.Provider{providerConf("a", "sglang", b.URL)}
	if err := h.op.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if h.op.state.Revision("a").Generation != genA+1 || h.op.state.Revision("gone") != nil {
		t.Errorf("revisions after reload: %+v", h.op.state.Providers)
	}
	if h.op.memo.Len() != 0 {
		t.Error("reload kept the /v1/loads memo")
	}
	if v := h.gauge(signals.Ready, "gone"); v != -1 {
		t.Errorf("removed provider still exported: %v", v)
	}
	if h.scrapeCount("gone", "success") != -1 {
		t.Error("removed provider's scrape counter remains")
	}
	bad := next
	bad.Site = "west"
	if err := h.op.Reload(&bad); err == nil {
		t.Error("a site change was applied on reload")
	}
}

func mustYAML(t *testing.T, c *config.Operator) []byte {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "site: %s\nstateDir: %s\nproviders:\n", c.Site, c.StateDir)
	for _, p := range c.Providers {
		extra := ""
		if p.Metrics.PoolName != "" {
			extra += fmt.Sprintf(", poolName: %s", p.Metrics.PoolName)
		}
		if p.Metrics.StaleAfter > 0 {
			extra += fmt.Sprintf(", staleAfter: %s", p.Metrics.StaleAfter)
		}
		if p.Metrics.RefreshInterval > 0 {
			extra += fmt.Sprintf(", refreshInterval: %s", p.Metrics.RefreshInterval)
		}
		maxRunning := ""
		if p.MaxRunning > 0 {
			maxRunning = fmt.Sprintf(", maxRunning: %d", p.MaxRunning)
		}
		fmt.Fprintf(&b, "  - {name: %s, model: %q, kind: %s, upstream: %q, metrics: {endpoint: %q, timeout: %s%s}%s}\n",
			p.Name, p.Model, p.Kind, p.Upstream, p.Metrics.Endpoint, p.Metrics.Timeout, extra, maxRunning)
	}
	return []byte(b.String())
}
