package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startSim serves a sim on loopback for the test's lifetime.
func startSim(t *testing.T, o Options) (*Sim, *httptest.Server) {
	t.Helper()
	if o.TTFT == 0 {
		o.TTFT = 20 * time.Millisecond
	}
	if o.TPOT == 0 {
		o.TPOT = 2 * time.Millisecond
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	return s, srv
}

func get(t *testing.T, url string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func post(t *testing.T, url, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func parseExposition(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("expfmt rejects the exposition: %v", err)
	}
	return fams
}

func scrape(t *testing.T, srv *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, body := get(t, srv.URL+"/metrics", "Accept", "text/plain;version=0.0.4")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
	}
	return parseExposition(t, body)
}

// value sums a family's values over series matching the label filter.
func value(f *dto.MetricFamily, match ...string) float64 {
	if f == nil {
		return -1
	}
	var sum float64
	for _, m := range f.Metric {
		ok := true
		for i := 0; i+1 < len(match); i += 2 {
			found := false
			for _, l := range m.Label {
				found = found || (l.GetName() == match[i] && l.GetValue() == match[i+1])
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

func chat(t *testing.T, srv *httptest.Server, maxTokens int, stream bool, header ...string) (*http.Response, []byte) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there"}],"max_tokens":%d,"stream":%v}`, DefaultModel, maxTokens, stream)
	return post(t, srv.URL+"/v1/chat/completions", body, header...)
}

func setControl(t *testing.T, srv *httptest.Server, body string) controlView {
	t.Helper()
	resp, b := post(t, srv.URL+"/sim/control", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("control %s: %d %s", body, resp.StatusCode, b)
	}
	var v controlView
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestEachKindExposesItsSeries(t *testing.T) {
	tests := []struct {
		kind   string
		series map[string][]string // family -> label names every series carries
	}{
		{KindEPP, map[string][]string{
			"llm_d_epp_ready_endpoints":                {"name"},
			"inference_pool_ready_pods":                {"name"},
			"llm_d_epp_average_running_requests":       {"name"},
			"llm_d_epp_average_queue_size":             {"name"},
			"llm_d_epp_average_kv_cache_utilization":   {"name"},
			"llm_d_epp_per_endpoint_queue_size":        {"model_server_endpoint", "name"},
			"inference_pool_per_pod_queue_size":        {"model_server_pod", "name"},
			"llm_d_epp_inflight_requests":              {"endpoint_name", "namespace", "producer_name", "fairness_id", "priority"},
			"llm_d_epp_request_total":                  {"fairness_id", "model_name", "priority", "target_model_name"},
			"llm_d_epp_request_ttft_seconds":           {"streaming", "model_name"},
			"llm_d_epp_request_streaming_tpot_seconds": {"model_name"},
			"go_goroutines":                            {},
			"process_start_time_seconds":               {},
		}},
		{KindVLLM, map[string][]string{
			"vllm:num_requests_running":        {"model_name", "engine"},
			"vllm:num_requests_waiting":        {"model_name", "engine"},
			"vllm:kv_cache_usage_perc":         {"model_name", "engine"},
			"vllm:time_to_first_token_seconds": {"model_name", "engine"},
			"vllm:prompt_tokens_created":       {"model_name", "engine"},
		}},
		{KindSGLang, map[string][]string{
			"sglang:num_running_reqs":            {"model_name", "engine_type", "tp_rank"},
			"sglang:num_queue_reqs":              {"model_name", "engine_type", "tp_rank"},
			"sglang:token_usage":                 {"model_name"},
			"sglang:time_to_first_token_seconds": {"model_name", "engine_type"},
			"sglang:num_retracted_reqs":          {"pid"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.kind, func(t *testing.T) {
			_, srv := startSim(t, Options{Kind: tc.kind, Endpoints: 2})
			chat(t, srv, 3, true)
			chat(t, srv, 3, false)
			fams := scrape(t, srv)
			for name, want := range tc.series {
				f := fams[name]
				if f == nil || len(f.Metric) == 0 {
					t.Errorf("%s: missing", name)
					continue
				}
				for _, m := range f.Metric {
					have := map[string]bool{}
					for _, l := range m.Label {
						have[l.GetName()] = true
					}
					for _, l := range want {
						if !have[l] {
							t.Errorf("%s: series %v lacks label %s", name, m.Label, l)
						}
					}
				}
			}
		})
	}
}

// fixtureFamilies parses an upstream fixture (its first line is a comment).
func fixtureFamilies(t *testing.T, file string) map[string]*dto.MetricFamily {
	t.Helper()
	b, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	return parseExposition(t, b)
}

func labelNames(m *dto.Metric) []string {
	var out []string
	for _, l := range m.Label {
		out = append(out, l.GetName())
	}
	sort.Strings(out)
	return out
}

func bucketBounds(m *dto.Metric) []float64 {
	var out []float64
	for _, b := range m.GetHistogram().GetBucket() {
		out = append(out, b.GetUpperBound())
	}
	return out
}

// TestSimMatchesFixtures: every family of the upstream fixtures (runtime
// noise aside) exists in the sim's exposition with the same type, HELP, label
// names and histogram buckets.
func TestSimMatchesFixtures(t *testing.T) {
	tests := []struct {
		kind, file string
		skip       func(string) bool
	}{
		{KindEPP, "epp-metrics.txt", func(n string) bool { return strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") }},
		{KindVLLM, "vllm-metrics.txt", func(n string) bool { return strings.HasPrefix(n, "python_") || strings.HasPrefix(n, "process_") }},
		{KindSGLang, "sglang-metrics.txt", func(string) bool { return false }},
	}
	for _, tc := range tests {
		t.Run(tc.kind, func(t *testing.T) {
			_, srv := startSim(t, Options{Kind: tc.kind, FlowControl: tc.kind == KindEPP, Endpoints: 1, Slots: 1, TTFT: 100 * time.Millisecond})
			exerciseEveryPath(t, srv)
			got := scrape(t, srv)
			want := fixtureFamilies(t, tc.file)
			compared := 0
			for name, wf := range want {
				if tc.skip(name) {
					continue
				}
				compared++
				gf := got[name]
				if gf == nil {
					t.Errorf("%s: in the fixture, missing from the sim", name)
					continue
				}
				if gf.GetType() != wf.GetType() {
					t.Errorf("%s: type %v, fixture %v", name, gf.GetType(), wf.GetType())
				}
				if gf.GetHelp() != wf.GetHelp() {
					t.Errorf("%s: HELP %q, fixture %q", name, gf.GetHelp(), wf.GetHelp())
				}
				wl, gl := labelNames(wf.Metric[0]), labelNames(gf.Metric[0])
				if !slices.Equal(wl, gl) {
					t.Errorf("%s: labels %v, fixture %v", name, gl, wl)
				}
				if wf.GetType() == dto.MetricType_HISTOGRAM {
					if wb, gb := bucketBounds(wf.Metric[0]), bucketBounds(gf.Metric[0]); !slices.Equal(wb, gb) {
						t.Errorf("%s: buckets %v, fixture %v", name, gb, wb)
					}
				}
			}
			if compared < 20 {
				t.Errorf("compared only %d families", compared)
			}
			t.Logf("%d families match %s", compared, tc.file)
		})
	}
}

// exerciseEveryPath sends traffic that touches every labelled series: a
// stream, a plain request, an error, and (with one slot) a request that has
// to queue.
func exerciseEveryPath(t *testing.T, srv *httptest.Server) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chat(t, srv, 4, i%2 == 0, fairnessHeader, []string{"team-a", "", "batch-jobs"}[i])
		}()
	}
	wg.Wait()
	setControl(t, srv, `{"errorRate": 1}`)
	if resp, _ := chat(t, srv, 2, false); resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("errorRate 1: status %d", resp.StatusCode)
	}
	setControl(t, srv, `{"errorRate": 0}`)
}

// TestEngineOpenMetricsEscaping: asked with Prometheus 2.x's Accept, the
// SGLang sim answers as prometheus_client >= 0.23 does (fixture
// sglang-metrics-openmetrics-underscores.txt): underscored samples, HELP and
// TYPE keeping the colon (counters without _total), and # EOF.
func TestEngineOpenMetricsEscaping(t *testing.T) {
	_, srv := startSim(t, Options{Kind: KindSGLang})
	chat(t, srv, 2, false)
	const promAccept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
	resp, body := get(t, srv.URL+"/metrics", "Accept", promAccept)
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "escaping=underscores") {
		t.Errorf("Content-Type %q", ct)
	}
	fixture, _ := os.ReadFile("testdata/sglang-metrics-openmetrics-underscores.txt")
	if g, w := metaAndSampleNames(body), metaAndSampleNames(fixture); !slices.Equal(g, w) {
		t.Errorf("names differ from the fixture:\n got  %v\n want %v", g, w)
	}
	if !bytes.HasSuffix(body, []byte("# EOF\n")) {
		t.Error("no # EOF")
	}
	// A plain text Accept keeps the colon names.
	_, plain := get(t, srv.URL+"/metrics", "Accept", "text/plain;version=0.0.4")
	if !bytes.Contains(plain, []byte("\nsglang:num_running_reqs{")) || bytes.Contains(plain, []byte("# EOF")) {
		t.Error("text/plain answer is not the colon exposition")
	}
	// And so does allow-utf-8.
	_, utf8 := get(t, srv.URL+"/metrics", "Accept", "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8")
	if !bytes.Contains(utf8, []byte("\nsglang:num_running_reqs{")) {
		t.Error("allow-utf-8 answer lost the colon")
	}
}

// metaAndSampleNames lists, in order and without duplicates, the names on
// HELP/TYPE lines and on sample lines, skipping the fixture's comment line.
func metaAndSampleNames(b []byte) []string {
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		var name string
		switch {
		case strings.HasPrefix(line, "# HELP "), strings.HasPrefix(line, "# TYPE "):
			name = "meta " + strings.Fields(line)[2]
		case strings.HasPrefix(line, "#"), line == "":
			continue
		default:
			name = line[:strings.IndexAny(line, "{ ")]
		}
		if !seen[name] && !strings.Contains(name, "_bucket") {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}

func TestPyFloat(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{14, "14.0"}, {0, "0.0"}, {0.6732, "0.6732"}, {55153934, "5.5153934e+07"},
		{3083340, "3.08334e+06"}, {1795933836.544065, "1.795933836544065e+09"},
		{20415, "20415.0"}, {4454.027698562756, "4454.027698562756"}, {0.00001, "1e-05"},
		{123456, "123456.0"}, {1e20, "1e+20"}, {-2.5, "-2.5"},
	} {
		if got := pyFloat(tc.in); got != tc.want {
			t.Errorf("pyFloat(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestEPPQueueingUnderLoad drives an EPP past its capacity: queueing shows in
// the pool average and per-endpoint queue, and in latency; then the pool
// gauges freeze while no endpoint is fresh.
func TestEPPQueueingUnderLoad(t *testing.T) {
	// Only the test refreshes the pool gauges, so what it reads is what it set up.
	s, srv := startSim(t, Options{Kind: KindEPP, Endpoints: 2, Slots: 2, TTFT: 10 * time.Millisecond, TPOT: 10 * time.Millisecond, RefreshInterval: time.Hour})
	// Alone, a 20-token request takes ttft + 19 × tpot = 200ms.
	start := time.Now()
	chat(t, srv, 20, false)
	alone := time.Since(start)

	// Twelve at once on four slots: eight must queue.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	latencies := make([]time.Duration, 12)
	for i := range latencies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			begin := time.Now()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions",
				strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":20}`, DefaultModel)))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			latencies[i] = time.Since(begin)
		}()
	}
	waitFor(t, func() bool {
		v := setControl(t, srv, `{}`)
		waiting := 0
		for _, e := range v.Engines {
			waiting += e.Waiting
		}
		return waiting >= 8
	})
	s.epp.refresh()
	fams := scrape(t, srv)
	if q := value(fams["llm_d_epp_average_queue_size"]); q <= 0 {
		t.Errorf("llm_d_epp_average_queue_size = %v under overload", q)
	}
	if q := value(fams["llm_d_epp_per_endpoint_queue_size"]); q <= 0 {
		t.Errorf("per-endpoint queue sum = %v under overload", q)
	}
	if r := value(fams["llm_d_epp_average_running_requests"]); r != 2 {
		t.Errorf("average running = %v, want the 2 slots per endpoint", r)
	}
	if v := value(fams["llm_d_epp_inflight_requests"]); v != 12 {
		t.Errorf("in-flight = %v, want 12", v)
	}

	// Freeze while the queue is still there: with no endpoint fresh the ready
	// count reads 0 and the averages keep their values after the load drains.
	frozen := value(fams["llm_d_epp_average_queue_size"])
	setControl(t, srv, `{"readyEndpoints": 0}`)
	wg.Wait()
	s.epp.refresh()
	fams = scrape(t, srv)
	if r := value(fams["llm_d_epp_ready_endpoints"]); r != 0 {
		t.Errorf("ready endpoints = %v after readyEndpoints 0", r)
	}
	if r := value(fams["inference_pool_ready_pods"]); r != 0 {
		t.Errorf("legacy ready pods = %v after readyEndpoints 0", r)
	}
	if q := value(fams["llm_d_epp_average_queue_size"]); q != frozen {
		t.Errorf("average queue %v after the load drained, want it frozen at %v", q, frozen)
	}
	if q := value(fams["llm_d_epp_per_endpoint_queue_size"]); q != 0 {
		t.Errorf("per-endpoint queue %v: it is computed at scrape time and must show the drained queue", q)
	}

	slices.Sort(latencies)
	if worst := latencies[len(latencies)-1]; worst < 2*alone {
		t.Errorf("worst latency under overload %v, alone %v: queueing did not show in latency", worst, alone)
	}

	setControl(t, srv, `{"readyEndpoints": null}`)
	s.epp.refresh()
	fams = scrape(t, srv)
	if r := value(fams["llm_d_epp_ready_endpoints"]); r != 2 {
		t.Errorf("ready endpoints = %v after returning to the truth", r)
	}
	if q := value(fams["llm_d_epp_average_queue_size"]); q != 0 {
		t.Errorf("average queue %v after the load drained, want 0", q)
	}
}

// TestEPPDrainedPoolFreezesEverything: with no endpoint left, the per-endpoint
// series vanish and every pool gauge, the ready count included, keeps its last
// value, which is what the operator's thaw rule detects.
func TestEPPDrainedPoolFreezesEverything(t *testing.T) {
	s, srv := startSim(t, Options{Kind: KindEPP, Endpoints: 3})
	setControl(t, srv, `{"endpoints": 0}`)
	s.epp.refresh()
	fams := scrape(t, srv)
	if r := value(fams["llm_d_epp_ready_endpoints"]); r != 3 {
		t.Errorf("ready endpoints = %v, want frozen at 3", r)
	}
	if f := fams["llm_d_epp_per_endpoint_queue_size"]; f != nil {
		t.Errorf("per-endpoint series remain: %v", f.Metric)
	}
	if resp, _ := chat(t, srv, 1, false); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("request to a drained pool: %d", resp.StatusCode)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStreamingSSE(t *testing.T) {
	_, srv := startSim(t, Options{Kind: KindVLLM})
	resp, body := chat(t, srv, 5, true)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	if len(events) != 7 { // five tokens, the final chunk, [DONE]
		t.Fatalf("%d events: %q", len(events), body)
	}
	if events[len(events)-1] != "data: [DONE]" {
		t.Errorf("last event %q", events[len(events)-1])
	}
	var chunk struct {
		Object  string `json:"object"`
		Choices []struct {
			Delta struct{ Role, Content string }
		}
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(events[0], "data: ")), &chunk); err != nil {
		t.Fatal(err)
	}
	if chunk.Object != "chat.completion.chunk" || chunk.Choices[0].Delta.Role != "assistant" || chunk.Choices[0].Delta.Content == "" {
		t.Errorf("first chunk %+v", chunk)
	}
}

func TestNonStreamingCompletion(t *testing.T) {
	_, srv := startSim(t, Options{Kind: KindSGLang})
	resp, body := post(t, srv.URL+"/v1/completions", `{"model":"Qwen/Qwen3-8B","prompt":"say hi","max_tokens":3}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var out struct {
		Object  string
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	if out.Object != "text_completion" || len(strings.Fields(out.Choices[0].Text)) != 3 || out.Usage.CompletionTokens != 3 || out.Choices[0].FinishReason != "length" {
		t.Errorf("response %s", body)
	}
}

// TestCancelFreesSlot: a client that goes away frees its slot for the next.
func TestCancelFreesSlot(t *testing.T) {
	s, srv := startSim(t, Options{Kind: KindVLLM, Slots: 1, TPOT: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"Qwen/Qwen3-8B","prompt":"x","max_tokens":4000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n') // the first event arrived
	cancel()
	resp.Body.Close()
	waitFor(t, func() bool { return s.Engines()[0].Load().Running == 0 })
	if r, _ := chat(t, srv, 1, false); r.StatusCode != http.StatusOK {
		t.Errorf("next request: %d", r.StatusCode)
	}
}

func TestBadInputGets400(t *testing.T) {
	_, srv := startSim(t, Options{Kind: KindSGLang})
	tests := []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		{"malformed chat JSON", "POST", "/v1/chat/completions", `{"model":`, 400, "invalid JSON"},
		{"negative max_tokens", "POST", "/v1/chat/completions", `{"model":"Qwen/Qwen3-8B","max_tokens":-1}`, 400, "max_tokens"},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope"}`, 404, "does not exist"},
		{"malformed control", "POST", "/sim/control", `{"slots":`, 400, "JSON object"},
		{"control not an object", "POST", "/sim/control", `[1]`, 400, "JSON object"},
		{"unknown control field", "POST", "/sim/control", `{"slotz": 3}`, 400, `unknown field(s) slotz`},
		{"control wrong type", "POST", "/sim/control", `{"slots": "many"}`, 400, "slots"},
		{"control out of range", "POST", "/sim/control", `{"errorRate": 2}`, 400, "errorRate"},
		{"control bad delay", "POST", "/sim/control", `{"metricsDelay": "soon"}`, 400, "metricsDelay"},
		{"zero slots", "POST", "/sim/control", `{"slots": 0}`, 400, "slots"},
		{"bad include", "GET", "/v1/loads?include=core,bogus", "", 400, "Invalid include sections: {'bogus'}"},
		{"bad dp_rank", "GET", "/v1/loads?dp_rank=x", "", 422, "dp_rank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var resp *http.Response
			var body []byte
			if tc.method == "GET" {
				resp, body = get(t, srv.URL+tc.path)
			} else {
				resp, body = post(t, srv.URL+tc.path, tc.body)
			}
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) {
				t.Errorf("%d %s, want %d containing %q", resp.StatusCode, body, tc.status, tc.want)
			}
		})
	}
	// Nothing above changed the world.
	if v := setControl(t, srv, `{}`); v.Slots != 8 || v.ErrorRate != 0 {
		t.Errorf("rejected control changed state: %+v", v.control)
	}
}

func TestMetricsTokenRequired(t *testing.T) {
	_, srv := startSim(t, Options{Kind: KindEPP, MetricsToken: "s3cret"})
	if resp, _ := get(t, srv.URL+"/metrics"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %d", resp.StatusCode)
	}
	if resp, _ := get(t, srv.URL+"/metrics", "Authorization", "Bearer wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", resp.StatusCode)
	}
	if resp, _ := get(t, srv.URL+"/metrics", "Authorization", "Bearer s3cret"); resp.StatusCode != http.StatusOK {
		t.Errorf("right token: %d", resp.StatusCode)
	}
}

func TestControlFaults(t *testing.T) {
	_, srv := startSim(t, Options{Kind: KindSGLang})
	t.Run("oversize", func(t *testing.T) {
		setControl(t, srv, `{"oversize": true}`)
		defer setControl(t, srv, `{"oversize": false}`)
		_, body := get(t, srv.URL+"/metrics")
		if len(body) <= 1<<20 {
			t.Errorf("oversized body is %d bytes", len(body))
		}
	})
	t.Run("delay", func(t *testing.T) {
		setControl(t, srv, `{"metricsDelay": "150ms"}`)
		defer setControl(t, srv, `{"metricsDelay": ""}`)
		start := time.Now()
		get(t, srv.URL+"/metrics")
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Errorf("answered after %v", d)
		}
	})
	t.Run("hang", func(t *testing.T) {
		setControl(t, srv, `{"metricsHang": true}`)
		defer setControl(t, srv, `{"metricsHang": false}`)
		client := &http.Client{Timeout: 200 * time.Millisecond}
		if _, err := client.Get(srv.URL + "/metrics"); err == nil {
			t.Error("a hung /metrics answered")
		}
	})
	t.Run("loadsStatus", func(t *testing.T) {
		setControl(t, srv, `{"loadsStatus": 503}`)
		defer setControl(t, srv, `{"loadsStatus": 0}`)
		if resp, _ := get(t, srv.URL+"/v1/loads"); resp.StatusCode != 503 {
			t.Errorf("status %d", resp.StatusCode)
		}
	})
	t.Run("down", func(t *testing.T) {
		setControl(t, srv, `{"down": true}`)
		defer setControl(t, srv, `{"down": false}`)
		for _, path := range []string{"/metrics", "/v1/loads", "/v1/models"} {
			if resp, _ := get(t, srv.URL+path); resp.StatusCode != 503 {
				t.Errorf("%s: %d", path, resp.StatusCode)
			}
		}
	})
	v := setControl(t, srv, `{}`)
	if v.Hits["/metrics"] < 4 || v.Hits["/v1/loads"] < 2 {
		t.Errorf("hit counters %v", v.Hits)
	}
}

func TestSlotsControlAdmitsQueued(t *testing.T) {
	s, srv := startSim(t, Options{Kind: KindVLLM, Slots: 1, TPOT: 20 * time.Millisecond})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); chat(t, srv, 30, false) }()
	}
	waitFor(t, func() bool { return s.Engines()[0].Load().Waiting == 2 })
	setControl(t, srv, `{"slots": 3}`)
	if l := s.Engines()[0].Load(); l.Running != 3 || l.Waiting != 0 {
		t.Errorf("after slots 3: %+v", l)
	}
	wg.Wait()
}

func TestLoadsMatchFixtures(t *testing.T) {
	for _, tc := range []struct {
		legacy bool
		file   string
	}{{false, "sglang-v1-loads.json"}, {true, "sglang-v1-loads-legacy.json"}} {
		t.Run(tc.file, func(t *testing.T) {
			_, srv := startSim(t, Options{Kind: KindSGLang, Endpoints: 2, LegacyLoads: tc.legacy})
			resp, body := get(t, srv.URL+"/v1/loads")
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			fixture, _ := os.ReadFile("testdata/" + tc.file)
			if g, w := jsonKeyPaths(t, body), jsonKeyPaths(t, fixture); !slices.Equal(g, w) {
				t.Errorf("keys differ from the fixture:\n got  %v\n want %v", g, w)
			}
		})
	}
	_, srv := startSim(t, Options{Kind: KindSGLang, Endpoints: 2})
	_, body := get(t, srv.URL+"/v1/loads?include=core&dp_rank=1")
	var out loadsCurrent
	json.Unmarshal(body, &out)
	if len(out.Loads) != 1 || out.Loads[0].DPRank != 1 || out.Loads[0].Memory != nil || out.Loads[0].Queues != nil {
		t.Errorf("include=core&dp_rank=1: %s", body)
	}
	_, body = get(t, srv.URL+"/v1/loads?dp_rank=7")
	json.Unmarshal(body, &out)
	if out.Loads == nil || len(out.Loads) != 0 {
		t.Errorf("out-of-range dp_rank: %s", body)
	}
	resp, body := get(t, srv.URL+"/v1/loads?format=prometheus&include=core")
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || !bytes.Contains(body, []byte(`sglang_num_running_reqs{dp_rank="0"} 0.0`)) {
		t.Errorf("format=prometheus: %s", body)
	}
}

// jsonKeyPaths lists a JSON document's object key paths (array indexes
// dropped), sorted, so two documents can be compared by shape.
func jsonKeyPaths(t *testing.T, b []byte) []string {
	t.Helper()
	if bytes.HasPrefix(b, []byte("//")) {
		b = b[bytes.IndexByte(b, '\n')+1:]
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				set[prefix+k] = true
				walk(prefix+k+".", c)
			}
		case []any:
			for _, c := range x {
				walk(prefix, c)
			}
		}
	}
	walk("", v)
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestEngineLoadUnderRequests(t *testing.T) {
	_, srv := startSim(t, Options{Kind: KindSGLang, Slots: 2, TPOT: 20 * time.Millisecond})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); chat(t, srv, 25, false) }()
	}
	var out loadsCurrent
	waitFor(t, func() bool {
		_, body := get(t, srv.URL+"/v1/loads?include=core")
		json.Unmarshal(body, &out)
		return len(out.Loads) == 1 && out.Loads[0].NumWaitingReqs == 1
	})
	r := out.Loads[0]
	if r.NumRunningReqs != 2 || r.NumWaitingUncachedTokens <= 0 || r.TokenUsage <= 0 || r.MaxRunningRequests != 2 {
		t.Errorf("loads under 3 requests on 2 slots: %+v", r)
	}
	fams := scrape(t, srv)
	if v := value(fams["sglang:num_queue_reqs"]); v != 1 {
		t.Errorf("sglang:num_queue_reqs = %v", v)
	}
	wg.Wait()
}

// TestPrefixCacheShortensPrefill: a conversation's second turn, resending
// the first turn's messages and more, finds its leading blocks cached on the
// engine that served the first: its prefill covers only what is new, and
// the engine counts the hits as vLLM and SGLang export them.
func TestPrefixCacheShortensPrefill(t *testing.T) {
	for _, kind := range []string{KindVLLM, KindSGLang} {
		t.Run(kind, func(t *testing.T) {
			s, err := New(Options{Kind: kind, Slots: 4, TTFT: time.Millisecond, TPOT: time.Millisecond,
				PrefillPerToken: 100 * time.Microsecond, PrefixCacheTokens: 1 << 16})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			long := strings.Repeat("a long system prompt that every turn resends; ", 80) // ~940 tokens
			ttft := func(messages string) time.Duration {
				body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":2,"messages":%s}`, DefaultModel, messages)
				start := time.Now()
				resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				r := bufio.NewReader(resp.Body)
				if _, err := r.ReadString('\n'); err != nil {
					t.Fatal(err)
				}
				first := time.Since(start)
				io.Copy(io.Discard, r)
				return first
			}
			turn1 := fmt.Sprintf(`[{"role":"system","content":%q},{"role":"user","content":"hi"}]`, long)
			turn2 := turn1[:len(turn1)-1] + `,{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]`
			cold := ttft(turn1)
			warm := ttft(turn2)
			if cold < 80*time.Millisecond || warm > cold/3 {
				t.Errorf("first turn %v (about 94 ms of prefill), second %v: want the second under a third", cold, warm)
			}
			l := s.Engines()[0].Load()
			if l.CacheHits < 900 || l.CacheQueries < 1800 {
				t.Errorf("cache hits %d of %d tokens queried", l.CacheHits, l.CacheQueries)
			}
			_, page := get(t, srv.URL+"/metrics")
			want := map[string]string{KindVLLM: "vllm:prefix_cache_hits_total", KindSGLang: "sglang:cache_hit_rate"}[kind]
			if !strings.Contains(string(page), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		})
	}
}

// TestControlLogShowsValues: a control change is logged with its values
// (readyEndpoints 0, or "truth"), not pointers.
func TestControlLogShowsValues(t *testing.T) {
	var logged bytes.Buffer
	_, srv := startSim(t, Options{Kind: KindEPP, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	setControl(t, srv, `{"readyEndpoints": 0}`)
	setControl(t, srv, `{"readyEndpoints": null}`)
	out := logged.String()
	if !strings.Contains(out, "state.readyEndpoints=0") || !strings.Contains(out, "state.readyEndpoints=truth") || strings.Contains(out, "0x") {
		t.Errorf("control log:\n%s\nwant readyEndpoints=0, then =truth, and no pointers", out)
	}
}

// TestSharedPrefillQueuesPrompts: with shared prefill an engine prefills
// one prompt at a time, so of two long prompts admitted together the
// second's first token waits for both prefills; each on its own, they
// prefill side by side.
func TestSharedPrefillQueuesPrompts(t *testing.T) {
	for _, shared := range []bool{false, true} {
		s, err := New(Options{Kind: KindSGLang, Slots: 4, TTFT: time.Millisecond, TPOT: time.Millisecond,
			PrefillPerToken: 100 * time.Microsecond, SharedPrefill: shared})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		prompt := strings.Repeat("word ", 1600) // 2,000 tokens: 200 ms of prefill
		body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":2,"prompt":%q}`, DefaultModel, prompt)
		firsts := make(chan time.Duration, 2)
		start := time.Now()
		for range 2 {
			go func() {
				resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					firsts <- 0
					return
				}
				defer resp.Body.Close()
				bufio.NewReader(resp.Body).ReadString('\n')
				firsts <- time.Since(start)
				io.Copy(io.Discard, resp.Body)
			}()
		}
		last := max(<-firsts, <-firsts)
		srv.Close()
		switch {
		case shared && last < 380*time.Millisecond:
			t.Errorf("shared prefill: the later first token came after %v, want both prefills (400 ms)", last)
		case !shared && last > 380*time.Millisecond:
			t.Errorf("prefill per request: the later first token came after %v, want one prefill (200 ms)", last)
		}
	}
}
