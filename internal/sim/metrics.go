package sim

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/grid-inference/grid/internal/clock"
)

// oversizeBytes is how far past the 1 MiB scrape cap an oversized /metrics
// body grows.
const oversizeBytes = 1<<20 + 64<<10

func (s *Sim) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if tok := s.opts.MetricsToken; tok != "" && r.Header.Get("Authorization") != "Bearer "+tok {
		// The EPP's controller-runtime authn filter answers 401 to a missing
		// or rejected token.
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	st := s.state()
	if st.MetricsHang {
		select {
		case <-r.Context().Done():
		case <-s.stop:
		}
		return
	}
	if st.metricsDelay > 0 {
		if !clock.Sleep(r.Context(), s.clk, st.metricsDelay) {
			return
		}
	}
	if s.opts.Kind == KindEPP {
		s.serveEPPMetrics(w, r, st.Oversize)
		return
	}
	x := s.engineExposition()
	if st.Oversize {
		pad(x)
	}
	om := wantsEscapedOpenMetrics(r.Header.Get("Accept"))
	if om {
		w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores")
	} else {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	}
	_ = x.render(w, om)
}

func (s *Sim) serveEPPMetrics(w http.ResponseWriter, r *http.Request, oversize bool) {
	// Compression is off so an oversized body stays one readable text stream.
	promhttp.HandlerFor(s.epp.reg, promhttp.HandlerOpts{DisableCompression: true}).ServeHTTP(w, r)
	if oversize {
		io.WriteString(w, "# HELP sim_padding Padding that pushes the exposition past the scrape cap.\n# TYPE sim_padding gauge\n")
		for line, written := 0, 0; written < oversizeBytes; line++ {
			n, err := fmt.Fprintf(w, "sim_padding{line=\"%07d\"} 0\n", line)
			if err != nil {
				return // the scraper stopped reading at its cap
			}
			written += n
		}
	}
}

// pad grows an engine exposition past the scrape cap.
func pad(x *pyExposition) {
	const lineLen = len(`sim_padding{line="0000000"} 0.0` + "\n")
	for i := range oversizeBytes/lineLen + 1 {
		f := x.family("sim_padding", "gauge", "Padding that pushes the exposition past the scrape cap.")
		f.samples = append(f.samples, pySample{"sim_padding", labels("line", fmt.Sprintf("%07d", i)), 0})
	}
}

// wantsEscapedOpenMetrics reproduces prometheus_client >= 0.23's negotiation:
// an OpenMetrics Accept without escaping=allow-utf-8 gets underscored names.
func wantsEscapedOpenMetrics(accept string) bool {
	return strings.Contains(accept, "application/openmetrics-text") && !strings.Contains(accept, "escaping=allow-utf-8")
}

// engineExposition renders the vLLM or SGLang /metrics of the current model.
func (s *Sim) engineExposition() *pyExposition {
	x := newPyExposition()
	engines := s.Engines()
	if s.opts.Kind == KindVLLM {
		s.pythonRuntime(x)
		s.vllmFamilies(x, engines)
	} else {
		s.sglangFamilies(x, engines)
	}
	return x
}

// pythonRuntime adds the process collectors of a single-process Python
// registry, filled from this process where a value exists.
func (s *Sim) pythonRuntime(x *pyExposition) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	for _, gen := range []string{"0", "1", "2"} {
		ls := labels("generation", gen)
		addPy(x, "python_gc_objects_collected_total", "counter", "Objects collected during gc", ls, float64(ms.NumGC))
		addPy(x, "python_gc_objects_uncollectable_total", "counter", "Uncollectable objects found during GC", ls, 0)
		addPy(x, "python_gc_collections_total", "counter", "Number of times this generation was collected", ls, float64(ms.NumGC))
	}
	addPy(x, "python_info", "gauge", "Python platform information",
		labels("implementation", "CPython", "major", "3", "minor", "11", "patchlevel", "7", "version", "3.11.7"), 1)
	addPy(x, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", nil, float64(ms.Sys))
	addPy(x, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", nil, float64(ms.HeapInuse+ms.StackInuse))
	addPy(x, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", nil, float64(s.start.UnixMilli())/1000)
	addPy(x, "process_open_fds", "gauge", "Number of open file descriptors.", nil, float64(openFDs()))
}

func addPy(x *pyExposition, name, typ, help string, ls []pyLabel, v float64) {
	f := x.family(strings.TrimSuffix(name, "_total"), typ, help)
	if typ == "gauge" {
		f.name = name
	}
	f.samples = append(f.samples, pySample{name, ls, v})
}

func openFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(entries)
}

func (s *Sim) vllmFamilies(x *pyExposition, engines []*Engine) {
	type engineState struct {
		ls    []pyLabel
		load  Load
		st    statsData
		since float64
	}
	states := make([]engineState, len(engines))
	for i, e := range engines {
		st := e.stats.snapshot()
		states[i] = engineState{labels("engine", e.name, "model_name", s.opts.Model), e.Load(), st, float64(st.created.UnixMilli()) / 1000}
	}
	for _, e := range states {
		x.gauge("vllm:num_requests_running", e.ls, float64(e.load.Running))
	}
	for _, e := range states {
		x.gauge("vllm:num_requests_waiting", e.ls, float64(e.load.Waiting))
	}
	for _, e := range states {
		x.gauge("vllm:kv_cache_usage_perc", e.ls, e.load.KVUsage())
	}
	counters := []struct {
		base string
		v    func(statsData) float64
	}{
		{"vllm:prefix_cache_queries", nil},
		{"vllm:prefix_cache_hits", nil},
		{"vllm:num_preemptions", func(statsData) float64 { return 0 }},
		{"vllm:prompt_tokens", func(d statsData) float64 { return d.promptTokens }},
		{"vllm:generation_tokens", func(d statsData) float64 { return d.genTokens }},
	}
	for _, c := range counters {
		for _, e := range states {
			var v float64
			switch c.base {
			case "vllm:prefix_cache_queries": // tokens, as vLLM counts them
				v = float64(e.load.CacheQueries)
			case "vllm:prefix_cache_hits":
				v = float64(e.load.CacheHits)
			default:
				v = c.v(e.st)
			}
			x.counter(c.base, e.ls, v, e.since, true)
		}
	}
	for _, reason := range []string{"stop", "length", "abort"} {
		for _, e := range states {
			x.counter("vllm:request_success", withLabel(e.ls, "finished_reason", reason), e.st.finished[reason], e.since, false)
		}
	}
	for _, reason := range []string{"stop", "length", "abort"} {
		for _, e := range states {
			x.createdGauge("vllm:request_success", withLabel(e.ls, "finished_reason", reason), e.since)
		}
	}
	hists := []struct {
		name string
		h    func(statsData) *histogram
	}{
		{"vllm:request_prompt_tokens", func(d statsData) *histogram { return d.promptHist }},
		{"vllm:request_generation_tokens", func(d statsData) *histogram { return d.genHist }},
		{"vllm:time_to_first_token_seconds", func(d statsData) *histogram { return d.ttft }},
		{"vllm:inter_token_latency_seconds", func(d statsData) *histogram { return d.itl }},
		{"vllm:e2e_request_latency_seconds", func(d statsData) *histogram { return d.e2e }},
		{"vllm:request_queue_time_seconds", func(d statsData) *histogram { return d.queueTime }},
	}
	for _, h := range hists {
		for _, e := range states {
			x.histogram(h.name, e.ls, h.h(e.st), false)
		}
		for _, e := range states {
			x.createdGauge(h.name, e.ls, e.since)
		}
	}
	for _, e := range states {
		x.gauge("vllm:cache_config_info", withLabel(labels(
			"block_size", "16", "cache_dtype", "auto", "enable_prefix_caching", "True",
			"gpu_memory_utilization", "0.9", "num_cpu_blocks", "0",
			"num_gpu_blocks", fmt.Sprint(e.load.KVCapacity/16), "prefix_caching_hash_algo", "sha256",
		), "engine", e.ls[0].value), 1)
	}
}

func (s *Sim) sglangFamilies(x *pyExposition, engines []*Engine) {
	scheduler := func(e *Engine) []pyLabel {
		kv := []string{"engine_type", "unified", "model_name", s.opts.Model, "moe_ep_rank", "0", "pp_rank", "0", "tp_rank", "0"}
		if len(engines) > 1 {
			kv = append(kv, "dp_rank", e.name)
		}
		return labels(kv...)
	}
	loads := make([]Load, len(engines))
	for i, e := range engines {
		loads[i] = e.Load()
	}
	gauges := []struct {
		name string
		v    func(Load) float64
	}{
		{"sglang:num_running_reqs", func(l Load) float64 { return float64(l.Running) }},
		{"sglang:num_queue_reqs", func(l Load) float64 { return float64(l.Waiting) }},
		{"sglang:num_grammar_queue_reqs", func(Load) float64 { return 0 }},
		{"sglang:gen_throughput", func(l Load) float64 { return round2(l.GenThroughput) }},
		{"sglang:cache_hit_rate", func(l Load) float64 { return round4(l.CacheHitRate()) }},
		{"sglang:token_usage", func(l Load) float64 { return round4(l.KVUsage()) }},
		{"sglang:num_used_tokens", func(l Load) float64 { return float64(l.KVUsed) }},
		{"sglang:max_total_num_tokens", func(l Load) float64 { return float64(l.KVCapacity) }},
		{"sglang:num_prefill_bootstrap_queue_reqs", func(Load) float64 { return 0 }},
		{"sglang:num_prefill_inflight_queue_reqs", func(Load) float64 { return 0 }},
		{"sglang:num_decode_prealloc_queue_reqs", func(Load) float64 { return 0 }},
		{"sglang:num_decode_transfer_queue_reqs", func(Load) float64 { return 0 }},
		{"sglang:utilization", func(Load) float64 { return 0 }},
	}
	for _, g := range gauges {
		for i, e := range engines {
			x.gauge(g.name, scheduler(e), g.v(loads[i]))
		}
	}
	// Tokenizer-side metrics are one series for the whole server.
	tok := labels("engine_type", "unified", "model_name", s.opts.Model)
	var total statsData
	for i, e := range engines {
		st := e.stats.snapshot()
		if i == 0 {
			total = st
			continue
		}
		total.promptTokens += st.promptTokens
		total.genTokens += st.genTokens
		total.requests += st.requests
		total.aborted += st.aborted
		total.sglTTFT.merge(st.sglTTFT)
		total.sglITL.merge(st.sglITL)
		total.sglE2E.merge(st.sglE2E)
	}
	x.histogram("sglang:time_to_first_token_seconds", tok, total.sglTTFT, true)
	x.histogram("sglang:inter_token_latency_seconds", tok, total.sglITL, true)
	x.histogram("sglang:e2e_request_latency_seconds", tok, total.sglE2E, true)
	pid := fmt.Sprint(os.Getpid())
	for _, name := range []string{"sglang:num_retracted_reqs", "sglang:num_paused_reqs"} {
		for _, e := range engines {
			x.gauge(name, withLabel(scheduler(e), "pid", pid), 0)
		}
	}
	x.counter("sglang:prompt_tokens", tok, total.promptTokens, 0, false)
	x.counter("sglang:generation_tokens", tok, total.genTokens, 0, false)
	var cached float64
	for _, l := range loads {
		cached += float64(l.CacheHits)
	}
	x.counter("sglang:cached_tokens", tok, cached, 0, false)
	x.counter("sglang:num_requests", tok, total.requests, 0, false)
	x.counter("sglang:num_aborted_requests", tok, total.aborted, 0, false)
}

func round4(v float64) float64 { return float64(int64(v*10000+0.5)) / 10000 }
