package backend

import (
	"context"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/readiness"
	"github.com/grid-inference/grid/internal/signals"
)

var quiet = slog.New(slog.DiscardHandler)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(name, "sglang-v1-loads") { // strip the // comment line
		b = b[strings.IndexByte(string(b), '\n')+1:]
	}
	return b
}

func target(t *testing.T, kind, url string) *Target {
	t.Helper()
	p := config.Provider{Name: "pool-a", Kind: kind, Metrics: config.Metrics{
		Endpoint: url, Path: "/metrics", Timeout: config.Duration(time.Second),
	}}
	tg := NewTarget(&p)
	t.Cleanup(tg.Close)
	return tg
}

func TestParseEPPFixture(t *testing.T) {
	r, err := ParseEPP(fixture(t, "epp-metrics.txt"), "qwen3-8b-pool")
	if err != nil {
		t.Fatal(err)
	}
	if r.Result != ResultSuccess || r.Ready != readiness.Known(3) || !r.UnitsReporting || r.MultiPool {
		t.Fatalf("reading %+v", r)
	}
	// EPP count: 14 + 9 + 20 = 43 beats (12 + 2.33) × 3 = 42.99; flow
	// control holds 6 + 3 + 1.
	if v, ok := r.Load.InFlight(r.Ready); !ok || math.Abs(v-53) > 1e-9 {
		t.Errorf("in-flight %v %v, want 53", v, ok)
	}
	if r.Latency == nil || r.Latency.TTFTCount != 48142+9099 || r.Latency.Requests != 2211+48213+9120 {
		t.Errorf("latency snapshot %+v", r.Latency)
	}
	// The prompts waiting for their first token: each endpoint's tokens
	// over its fairness ids, 3,072 + 768, 1,024, 9,216 + 2,304.
	if v := r.Load.PrefillTokens; v == nil || *v != 3072+768+1024+9216+2304 {
		t.Errorf("prefill backlog %v, want 16384 tokens", v)
	}
	names := map[string]int{}
	for _, row := range r.Rows {
		names[row.Name]++
		if !signals.IsContract(row.Name) {
			t.Errorf("non-contract row %s", row.Name)
		}
	}
	for name, n := range map[string]int{
		signals.EPPReadyEndpoints: 1, signals.LegacyReadyPods: 1, signals.EPPAverageQueue: 1,
		signals.EPPPerEndpointQueue: 3, signals.LegacyPerPodQueue: 3, signals.EPPFlowControlQueue: 1, signals.EPPStdDevKV: 1,
	} {
		if names[name] != n {
			t.Errorf("%d rows of %s, want %d", names[name], name, n)
		}
	}
}

func TestParseEPPPoolFilter(t *testing.T) {
	body := `llm_d_epp_ready_endpoints{name="a"} 2
llm_d_epp_ready_endpoints{name="b"} 5
llm_d_epp_average_running_requests{name="a"} 1
llm_d_epp_average_running_requests{name="b"} 9
llm_d_epp_average_queue_size{name="a"} 0
llm_d_epp_average_queue_size{name="b"} 9
llm_d_epp_flow_control_queue_size{inference_pool="a",priority="0"} 1
llm_d_epp_flow_control_queue_size{inference_pool="b",priority="0"} 7
llm_d_epp_flow_control_queue_size{priority="0"} 100
llm_d_epp_inflight_requests{endpoint_name="e1",namespace="x",producer_name="p"} 50
llm_d_epp_inflight_requests{endpoint_name="e1",namespace="y",producer_name="p"} 50
`
	r, err := ParseEPP([]byte(body), "a")
	if err != nil {
		t.Fatal(err)
	}
	if r.Ready != readiness.Known(2) || !r.MultiPool {
		t.Fatalf("ready %v multi %v", r.Ready, r.MultiPool)
	}
	// Multi-pool: the per-endpoint count is not attributable; averages
	// (1 + 0) × 2, plus pool a's flow control only (unlabelled never counts).
	if v, ok := r.Load.InFlight(r.Ready); !ok || v != 3 {
		t.Errorf("in-flight %v %v, want 3", v, ok)
	}
	// Without a pool every series counts, the max for gauges.
	r, _ = ParseEPP([]byte(body), "")
	if r.Ready != readiness.Known(5) || r.Load.FlowControl != 108 {
		t.Errorf("no pool: ready %v flow %v", r.Ready, r.Load.FlowControl)
	}
}

func TestParseEPPLegacyAndMissing(t *testing.T) {
	r, _ := ParseEPP([]byte("inference_pool_ready_pods{name=\"p\"} 4\n"), "p")
	if r.Ready != readiness.Known(4) || r.Result != ResultSuccess {
		t.Errorf("legacy only: %+v", r)
	}
	r, _ = ParseEPP([]byte("vllm:num_requests_running 3\n"), "p")
	if r.Ready.Known || r.Result != ResultNoSeries || !strings.Contains(r.Missing, "for poolName p") {
		t.Errorf("no ready series: %+v", r)
	}
	// The real EPP reports every pool it serves: a poolName it reports
	// nothing of is not served there, 0 ready endpoints, not unknown.
	r, _ = ParseEPP([]byte("inference_pool_ready_pods{name=\"qwen-pool\"} 2\ninference_pool_average_running_requests{name=\"qwen-pool\"} 3\n"), "other-pool")
	if r.Ready != readiness.Known(0) || r.Result != ResultNoSeries ||
		r.Missing != "the EPP reports the ready endpoints of pool qwen-pool, not of poolName other-pool" || r.Load.AverageRunning != nil {
		t.Errorf("a pool the EPP does not serve: %+v", r)
	}
	if _, err := ParseEPP([]byte("a{x=\"\xff\"} 1"), ""); ClassOf(err) != ClassParse {
		t.Errorf("non-UTF-8: %v", err)
	}
	// A scraped grid_site label is kept as scraped: the operator moves it
	// aside when it attributes the row (TestScrapedSiteLabelsAreExported).
	r, _ = ParseEPP([]byte(`llm_d_epp_ready_endpoints{grid_site="evil",name="p"} 1`+"\n"), "p")
	if v, ok := r.Rows[0].Label("grid_site"); !ok || v != "evil" {
		t.Errorf("grid_site not kept as scraped: %+v", r.Rows[0])
	}
}

// TestInFlightRules are the worked cases of docs/protocol.md §4.4.
func TestInFlightRules(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name  string
		load  Load
		ready readiness.Count
		want  float64
		ok    bool
	}{
		{"EPP count larger", Load{EPPCount: f(43), AverageRunning: f(12), AverageQueue: f(2.33)}, readiness.Known(3), 43, true},
		{"averages larger", Load{EPPCount: f(10), AverageRunning: f(12), AverageQueue: f(2)}, readiness.Known(3), 42, true},
		{"an EPP restart zeroes its count; averages hold", Load{EPPCount: f(0), AverageRunning: f(5), AverageQueue: f(1)}, readiness.Known(2), 12, true},
		{"averages only", Load{AverageRunning: f(4), AverageQueue: f(1)}, readiness.Known(2), 10, true},
		{"EPP count only", Load{EPPCount: f(7)}, readiness.Known(2), 7, true},
		{"one average missing", Load{AverageRunning: f(4)}, readiness.Known(2), 0, false},
		{"neither", Load{}, readiness.Known(2), 0, false},
		{"flow control added", Load{AverageRunning: f(4), AverageQueue: f(0), FlowControl: 5}, readiness.Known(1), 9, true},
		{"no fresh endpoint publishes nothing", Load{EPPCount: f(7), AverageRunning: f(4), AverageQueue: f(1)}, readiness.Known(0), 0, false},
		{"unknown ready publishes nothing", Load{EPPCount: f(7)}, readiness.Count{}, 0, false},
		{"an engine's own count", Load{Direct: f(6)}, readiness.Known(1), 6, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.load.InFlight(tc.ready)
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("InFlight = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// engineStub serves /v1/loads with a configurable answer and vLLM gauges on
// /metrics, counting requests per route.
type engineStub struct {
	*httptest.Server
	loadsStatus atomic.Int64
	loadsBody   atomic.Value // string
	loads       atomic.Int64
	metrics     atomic.Int64
}

func newEngineStub(t *testing.T, status int, body string) *engineStub {
	s := &engineStub{}
	s.loadsStatus.Store(int64(status))
	s.loadsBody.Store(body)
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/loads", func(w http.ResponseWriter, r *http.Request) {
		s.loads.Add(1)
		if got := r.URL.RawQuery; got != LoadsQuery {
			t.Errorf("probe query %q", got)
		}
		w.WriteHeader(int(s.loadsStatus.Load()))
		w.Write([]byte(s.loadsBody.Load().(string)))
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		s.metrics.Add(1)
		if a := r.Header.Get("Accept"); !strings.HasPrefix(a, "text/plain;version=0.0.4") {
			t.Errorf("Accept %q", a)
		}
		w.Write([]byte(`vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.3
`))
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func scrapeN(t *testing.T, tg *Target, memo *ProbeMemo, n int) *Reading {
	t.Helper()
	var r *Reading
	for range n {
		var err error
		if r, err = Scrape(context.Background(), tg, memo, true, quiet); err != nil {
			t.Fatalf("scrape: %v", err)
		}
	}
	return r
}

func TestProbeMemo(t *testing.T) {
	native := string(fixture(t, "sglang-v1-loads.json"))
	tests := []struct {
		name        string
		status      int
		body        string
		kind        string
		wantLoads   int64
		wantMetrics int64
		wantMemo    int
		wantSource  string
		wantRunning float64
	}{
		{"available: no metrics scrape", 200, native, "vllm", 5, 0, 0, SourceLoads, 23 + 17},
		{"404 probed once", 404, "not found", "vllm", 1, 5, 1, SourceMetrics, 5},
		{"405 probed once", 405, "", "sglang", 1, 5, 1, SourceMetrics, 0},
		{"501 probed once", 501, "", "auto", 1, 5, 1, SourceMetrics, 5},
		{"503 probed every cycle", 503, "", "vllm", 5, 5, 0, SourceMetrics, 5},
		{"401 probed every cycle", 401, "", "vllm", 5, 5, 0, SourceMetrics, 5},
		{"200 non-load body memoizes like 404", 200, `<html>hello</html>`, "vllm", 1, 5, 1, SourceMetrics, 5},
		{"200 JSON without loads memoizes", 200, `{"status":"ok"}`, "vllm", 1, 5, 1, SourceMetrics, 5},
		{"empty loads keeps probing", 200, `{"loads":[]}`, "vllm", 5, 5, 0, SourceMetrics, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stub := newEngineStub(t, tc.status, tc.body)
			memo := NewProbeMemo(clock.Real{}, nil)
			r := scrapeN(t, target(t, tc.kind, stub.URL), memo, 5)
			if got := stub.loads.Load(); got != tc.wantLoads {
				t.Errorf("/v1/loads asked %d times, want %d", got, tc.wantLoads)
			}
			if got := stub.metrics.Load(); got != tc.wantMetrics {
				t.Errorf("/metrics scraped %d times, want %d", got, tc.wantMetrics)
			}
			if memo.Len() != tc.wantMemo {
				t.Errorf("memo holds %d", memo.Len())
			}
			if tc.kind == "sglang" { // the stub's /metrics has no sglang shape
				if r.Result != ResultNoSeries || r.Ready.Known {
					t.Errorf("sglang fallback on vLLM gauges: %+v", r)
				}
				return
			}
			if r.Source != tc.wantSource || r.Engine == nil || r.Engine.Running != tc.wantRunning {
				t.Errorf("reading source %s engine %+v", r.Source, r.Engine)
			}
		})
	}
}

func TestProbeForgetReprobes(t *testing.T) {
	stub := newEngineStub(t, 404, "")
	memo := NewProbeMemo(clock.Real{}, nil)
	tg := target(t, "vllm", stub.URL)
	scrapeN(t, tg, memo, 3)
	// The operator upgraded the engine to one that serves /v1/loads and
	// changed the provider's config: its memo entry is forgotten.
	stub.loadsStatus.Store(200)
	stub.loadsBody.Store(string(fixture(t, "sglang-v1-loads-legacy.json")))
	memo.Forget(tg.LoadsURL)
	r := scrapeN(t, tg, memo, 1)
	if stub.loads.Load() != 2 || r.Source != SourceLoads {
		t.Errorf("after Forget: %d probes, source %s", stub.loads.Load(), r.Source)
	}
	// The legacy era decodes too, summed over DP ranks.
	if r.Engine.Running != 40 || r.Engine.Waiting != 2 || r.Engine.Ranks != 2 {
		t.Errorf("legacy loads: %+v", r.Engine)
	}
	memo.markAbsent("x")
	memo.Clear()
	if memo.Len() != 0 {
		t.Error("Clear left entries")
	}
}

func TestGenericEngineWithoutLoadsIsUnknown(t *testing.T) {
	stub := newEngineStub(t, 404, "")
	memo := NewProbeMemo(clock.Real{}, nil)
	r := scrapeN(t, target(t, config.KindGeneric, stub.URL), memo, 3)
	if r.Result != ResultNoSeries || r.Ready.Known || stub.metrics.Load() != 0 || stub.loads.Load() != 1 {
		t.Errorf("generic without /v1/loads: result %s ready %v, metrics %d, probes %d", r.Result, r.Ready, stub.metrics.Load(), stub.loads.Load())
	}
}

func TestEngineReading(t *testing.T) {
	stub := newEngineStub(t, 200, string(fixture(t, "sglang-v1-loads.json")))
	r := scrapeN(t, target(t, "sglang", stub.URL), NewProbeMemo(clock.Real{}, nil), 1)
	e := r.Engine
	if v := r.Load.PrefillTokens; v == nil || *v != 5120 {
		t.Errorf("prefill backlog %v, want the ranks' 5120 waiting uncached tokens", v)
	}
	if e.WaitingUncachedTokens != 5120 || math.Abs(e.GenThroughput-(1711.42+1388.9)) > 1e-9 || math.Abs(e.TokenUsage-(0.5758+0.4657)/2) > 1e-9 {
		t.Errorf("engine load %+v", e)
	}
	if r.Ready != readiness.Known(1) {
		t.Errorf("an engine is one ready endpoint, got %v", r.Ready)
	}
	if v := r.Load.MaxRunning; v == nil || *v != 2*256 {
		t.Errorf("declared limit %v, want the two ranks' 256 each", v)
	}
	if v, ok := r.Load.InFlight(r.Ready); !ok || v != 42 {
		t.Errorf("in-flight %v, want running 40 + waiting 2", v)
	}
}

func TestParseEngineMetricsShapes(t *testing.T) {
	sgl := fixture(t, "sglang-metrics.txt")
	om := fixture(t, "sglang-metrics-openmetrics-underscores.txt")
	vl := fixture(t, "vllm-metrics.txt")
	for _, tc := range []struct {
		name    string
		body    []byte
		kind    string
		ok      bool
		running float64
	}{
		{"sglang colon names", sgl, "sglang", true, 21},
		{"sglang underscored names", om, "sglang", true, 21},
		{"vllm", vl, "vllm", true, 14},
		{"auto finds sglang", sgl, "auto", true, 21},
		{"auto finds vllm", vl, "auto", true, 14},
		{"vllm shape absent", sgl, "vllm", false, 0},
		{"old vllm KV name", []byte("vllm:gpu_cache_usage_perc 0.2\nvllm:num_requests_running 4\n"), "vllm", true, 4},
		{"vllm without KV gauge is no load", []byte("vllm:num_requests_running 4\n"), "vllm", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, ok, err := ParseEngineMetrics(tc.body, tc.kind)
			if err != nil || ok != tc.ok || (ok && e.Running != tc.running) {
				t.Errorf("ok %v err %v engine %+v; want ok %v running %v", ok, err, e, tc.ok, tc.running)
			}
		})
	}
}

func TestFailureClasses(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	mux := http.NewServeMux()
	mux.HandleFunc("/hang/metrics", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/401/metrics", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(401) })
	mux.HandleFunc("/403/metrics", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(403) })
	mux.HandleFunc("/500/metrics", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) })
	mux.HandleFunc("/big/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Repeat("llm_d_epp_ready_endpoints{name=\"p\"} 1\n", BodyCap/30)))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tlsSrv := httptest.NewTLSServer(mux)
	t.Cleanup(tlsSrv.Close)
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedURL := "http://" + closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		name, url string
		class     Class
		tweak     func(*config.Provider)
	}{
		{"timeout", srv.URL + "/hang", ClassTimeout, func(p *config.Provider) { p.Metrics.Timeout = config.Duration(200 * time.Millisecond) }},
		{"unauthorized 401", srv.URL + "/401", ClassUnauthorized, nil},
		{"unauthorized 403", srv.URL + "/403", ClassUnauthorized, nil},
		{"http", srv.URL + "/500", ClassHTTP, nil},
		{"connect", closedURL, ClassConnect, nil},
		{"dns", "http://no-such-host.invalid", ClassDNS, nil},
		{"tls", tlsSrv.URL + "/500", ClassTLS, nil},
		{"config: unreadable token", srv.URL + "/500", ClassConfig, func(p *config.Provider) { p.Metrics.BearerTokenFile = "/nonexistent/token" }},
		{"config: bad CA", srv.URL + "/500", ClassConfig, func(p *config.Provider) { p.Metrics.TLS = &config.ClientTLS{CA: "/nonexistent/ca.pem"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := config.Provider{Name: "p", Kind: config.KindEPP, Metrics: config.Metrics{Endpoint: tc.url, Path: "/metrics", Timeout: config.Duration(2 * time.Second)}}
			if tc.tweak != nil {
				tc.tweak(&p)
			}
			tg := NewTarget(&p)
			defer tg.Close()
			_, err := Scrape(context.Background(), tg, NewProbeMemo(clock.Real{}, nil), true, quiet)
			if got := ClassOf(err); got != tc.class {
				t.Errorf("class %q (%v), want %q", got, err, tc.class)
			}
		})
	}
	t.Run("body_cap leaves readiness unknown", func(t *testing.T) {
		r, err := Scrape(context.Background(), target(t, config.KindEPP, srv.URL+"/big"), NewProbeMemo(clock.Real{}, nil), true, quiet)
		if err != nil || r.Result != string(ClassBodyCap) || r.Ready.Known {
			t.Errorf("reading %+v err %v", r, err)
		}
	})
}

func FuzzDecodeLoads(f *testing.F) {
	for _, name := range []string{"sglang-v1-loads.json", "sglang-v1-loads-legacy.json"} {
		b, _ := os.ReadFile(filepath.Join("testdata", name))
		f.Add(b[strings.IndexByte(string(b), '\n')+1:])
	}
	f.Add([]byte(`{"loads":[{"num_running_reqs":-1,"num_waiting_reqs":0}]}`))
	f.Add([]byte(`{"loads":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, outcome, _ := DecodeLoads(body)
		if outcome != probeAvailable {
			return
		}
		e := r.engineLoad()
		if e.Running < 0 || e.Waiting < 0 || math.IsNaN(e.TokenUsage) || e.Ranks == 0 {
			t.Fatalf("admitted load %+v", e)
		}
	})
}

func FuzzParseEPP(f *testing.F) {
	b, _ := os.ReadFile("testdata/epp-metrics.txt")
	f.Add(b[:4096], "qwen3-8b-pool")
	f.Add([]byte("llm_d_epp_ready_endpoints{name=\"p\"} NaN\n"), "p")
	f.Fuzz(func(t *testing.T, body []byte, pool string) {
		r, err := ParseEPP(body, pool)
		if err != nil {
			return
		}
		if v, ok := r.Load.InFlight(r.Ready); ok && (math.IsNaN(v) || math.IsInf(v, 0)) {
			t.Fatalf("in-flight %v", v)
		}
	})
}

// TestProbeMemoLifecycle: an absence is remembered for ReprobeAfter, then
// the engine is asked again (and the expiry told); an absence seen while the
// provider is not ready (an engine starting up) is not remembered.
func TestProbeMemoLifecycle(t *testing.T) {
	stub := newEngineStub(t, 404, "")
	clk := clock.NewFake(time.Unix(1000, 0))
	var expired []string
	memo := NewProbeMemo(clk, func(url string) { expired = append(expired, url) })
	tg := target(t, "vllm", stub.URL)

	if _, err := Scrape(context.Background(), tg, memo, false, quiet); err != nil {
		t.Fatal(err)
	}
	if memo.Len() != 0 {
		t.Fatal("an absence found while the provider is not ready was remembered")
	}
	scrapeN(t, tg, memo, 3) // ready: asked once, remembered
	if stub.loads.Load() != 2 || memo.Len() != 1 {
		t.Fatalf("%d probes, memo %d", stub.loads.Load(), memo.Len())
	}
	clk.Advance(ReprobeAfter - time.Second)
	scrapeN(t, tg, memo, 1)
	if stub.loads.Load() != 2 {
		t.Fatal("asked again before ReprobeAfter")
	}
	clk.Advance(time.Second)
	stub.loadsStatus.Store(200)
	stub.loadsBody.Store(string(fixture(t, "sglang-v1-loads.json")))
	if r := scrapeN(t, tg, memo, 1); r.Source != SourceLoads || stub.loads.Load() != 3 {
		t.Errorf("after ReprobeAfter: source %s, %d probes", r.Source, stub.loads.Load())
	}
	if len(expired) != 1 || expired[0] != tg.LoadsURL {
		t.Errorf("expiries told: %v", expired)
	}
}

// TestGenericEngineOverTheBodyCapIsUnknown: a generic engine whose
// /v1/loads answer exceeds the 1 MiB budget answered: the scrape is not a
// failure, its readiness is unknown (so it is never declared down for it),
// and the result says body_cap, as an EPP's oversized /metrics does.
func TestGenericEngineOverTheBodyCapIsUnknown(t *testing.T) {
	stub := newEngineStub(t, 200, `{"loads":[`+strings.Repeat(`{"num_running_reqs":1},`, 60_000)+`{}]}`)
	memo := NewProbeMemo(clock.Real{}, nil)
	r := scrapeN(t, target(t, config.KindGeneric, stub.URL), memo, 2)
	if r.Result != string(ClassBodyCap) || r.Ready.Known || r.Source != SourceLoads {
		t.Errorf("generic with a 1.3 MiB /v1/loads: result %s, ready %v, source %s; want body_cap, unknown, loads", r.Result, r.Ready, r.Source)
	}
	if memo.Absent(target(t, config.KindGeneric, stub.URL).LoadsURL) {
		t.Error("an oversized answer was remembered as no /v1/loads")
	}
}

// TestDeclaredLimitNeedsEveryRank: an engine's declared limit is its
// ranks' together, and unknown, not smaller, when a rank does not say it.
func TestDeclaredLimitNeedsEveryRank(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       float64 // 0: unknown
	}{
		{"two ranks", `{"loads":[{"num_running_reqs":1,"num_waiting_reqs":0,"max_running_requests":48},{"num_running_reqs":0,"num_waiting_reqs":0,"max_running_requests":48}]}`, 96},
		{"one rank silent", `{"loads":[{"num_running_reqs":1,"num_waiting_reqs":0,"max_running_requests":48},{"num_running_reqs":0,"num_waiting_reqs":0}]}`, 0},
		{"a zero, as older engines send", `{"loads":[{"num_running_reqs":1,"num_waiting_reqs":0,"max_running_requests":0}]}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, outcome, why := DecodeLoads([]byte(tc.body))
			if outcome != probeAvailable {
				t.Fatalf("outcome %v: %s", outcome, why)
			}
			e := r.engineLoad()
			l := engineLoad(e, 0, e.Running, e.Waiting)
			switch {
			case tc.want == 0 && l.MaxRunning != nil:
				t.Errorf("declared limit %v, want unknown", *l.MaxRunning)
			case tc.want != 0 && (l.MaxRunning == nil || *l.MaxRunning != tc.want):
				t.Errorf("declared limit %v, want %v", l.MaxRunning, tc.want)
			}
		})
	}
}
