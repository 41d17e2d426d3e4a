package sim

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// eppMetrics is the llm-d EPP's /metrics registry: current llm_d_epp_* names
// dual-emitted with their legacy twins, as llm-d-router v0.9+ does. The pool
// gauges are recomputed on a tick and frozen while no endpoint is fresh; the
// per-endpoint queue is computed at scrape time over every endpoint.
type eppMetrics struct {
	s   *Sim
	reg *prometheus.Registry

	reqTotal, reqTotalLegacy *prometheus.CounterVec
	errTotal, errTotalLegacy *prometheus.CounterVec
	running, runningLegacy   *prometheus.GaugeVec
	duration, durationLegacy *prometheus.HistogramVec
	ttft, tpot               *prometheus.HistogramVec
	inflightReqs             *prometheus.GaugeVec
	inflightTokens           *prometheus.GaugeVec

	pool map[string]prometheus.Gauge // family name -> the pool's series

	fcQueue, fcQueueLegacy *prometheus.GaugeVec
}

const (
	eppNamespace    = "llm-d"
	eppProducerName = "inflight-load-producer"
	eppPriority     = "0"
)

// Pool gauge families, current and legacy, in the order refresh writes them.
var eppPoolFamilies = []string{
	"llm_d_epp_ready_endpoints", "inference_pool_ready_pods",
	"llm_d_epp_average_running_requests", "inference_pool_average_running_requests",
	"llm_d_epp_average_queue_size", "inference_pool_average_queue_size",
	"llm_d_epp_average_kv_cache_utilization", "inference_pool_average_kv_cache_utilization",
	"llm_d_epp_std_dev_running_requests", "llm_d_epp_std_dev_queue_size", "llm_d_epp_std_dev_kv_cache_utilization",
}

func newEPPMetrics(s *Sim) *eppMetrics {
	m := &eppMetrics{s: s, reg: prometheus.NewRegistry(), pool: map[string]prometheus.Gauge{}}
	reqLabels := []string{"fairness_id", "model_name", "priority", "target_model_name"}
	counter := func(name string, ls ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: helpText[name]}, ls)
		m.reg.MustRegister(v)
		return v
	}
	gauge := func(name string, ls ...string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: helpText[name]}, ls)
		m.reg.MustRegister(v)
		return v
	}
	hist := func(name string, buckets []float64, ls ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: helpText[name], Buckets: buckets}, ls)
		m.reg.MustRegister(v)
		return v
	}
	m.reqTotal = counter("llm_d_epp_request_total", reqLabels...)
	m.reqTotalLegacy = counter("inference_objective_request_total", "model_name", "priority", "target_model_name")
	m.errTotal = counter("llm_d_epp_request_error_total", append([]string{"error_code"}, reqLabels...)...)
	m.errTotalLegacy = counter("inference_objective_request_error_total", "error_code", "model_name", "target_model_name")
	m.running = gauge("llm_d_epp_request_running", reqLabels...)
	m.runningLegacy = gauge("inference_objective_running_requests", "model_name")
	m.duration = hist("llm_d_epp_request_duration_seconds", eppDurationBuckets, reqLabels...)
	m.durationLegacy = hist("inference_objective_request_duration_seconds", eppDurationBuckets, "model_name", "target_model_name")
	m.ttft = hist("llm_d_epp_request_ttft_seconds", eppTTFTBuckets, append([]string{"streaming"}, reqLabels...)...)
	m.tpot = hist("llm_d_epp_request_streaming_tpot_seconds", eppTPOTBuckets, reqLabels...)
	inflightLabels := []string{"endpoint_name", "fairness_id", "namespace", "priority", "producer_name"}
	m.inflightReqs = gauge("llm_d_epp_inflight_requests", inflightLabels...)
	m.inflightTokens = gauge("llm_d_epp_inflight_tokens", inflightLabels...)
	for _, name := range eppPoolFamilies {
		m.pool[name] = gauge(name, "name").WithLabelValues(s.opts.Pool)
	}
	for _, name := range []string{"llm_d_epp_info", "inference_extension_info"} {
		gauge(name, "build_ref", "commit").WithLabelValues("v0.10.0", "71f4f0999f95b96c49a9d0c4afbd18dfdb943c26").Set(1)
	}
	if s.opts.FlowControl {
		fcLabels := []string{"fairness_id", "inference_pool", "model_name", "priority", "target_model_name"}
		m.fcQueue = gauge("llm_d_epp_flow_control_queue_size", fcLabels...)
		m.fcQueueLegacy = gauge("inference_extension_flow_control_queue_size", fcLabels...)
	}
	m.reg.MustRegister(scrapeTimeCollector{m}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// refresh recomputes the pool gauges as the EPP's metrics logger does: over
// the fresh endpoints only, averages and sample standard deviations rounded to
// two decimals. With no fresh endpoint it sets the ready count to 0 and leaves
// every average frozen; with no endpoint at all (a drained pool) it touches
// nothing, so even the ready count keeps its last value.
func (m *eppMetrics) refresh() {
	s := m.s
	s.mu.Lock()
	engines := append([]*Engine(nil), s.engines...)
	fresh := len(engines)
	if c := s.control.ReadyEndpoints; c != nil {
		fresh = min(*c, fresh)
	}
	s.mu.Unlock()
	if len(engines) == 0 {
		return
	}
	m.pool["llm_d_epp_ready_endpoints"].Set(float64(fresh))
	m.pool["inference_pool_ready_pods"].Set(float64(fresh))
	if fresh == 0 {
		return
	}
	running := make([]float64, fresh)
	queue := make([]float64, fresh)
	kv := make([]float64, fresh)
	for i, e := range engines[:fresh] {
		l := e.Load()
		running[i], queue[i], kv[i] = float64(l.Running), float64(l.Waiting), l.KVUsage()
	}
	set := func(current, legacy string, v float64) {
		m.pool[current].Set(v)
		if legacy != "" {
			m.pool[legacy].Set(v)
		}
	}
	set("llm_d_epp_average_running_requests", "inference_pool_average_running_requests", round2(mean(running)))
	set("llm_d_epp_average_queue_size", "inference_pool_average_queue_size", round2(mean(queue)))
	set("llm_d_epp_average_kv_cache_utilization", "inference_pool_average_kv_cache_utilization", round2(mean(kv)))
	set("llm_d_epp_std_dev_running_requests", "", round2(sampleStdDev(running)))
	set("llm_d_epp_std_dev_queue_size", "", round2(sampleStdDev(queue)))
	set("llm_d_epp_std_dev_kv_cache_utilization", "", round2(sampleStdDev(kv)))
}

func mean(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

func sampleStdDev(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	mu := mean(xs)
	var ss float64
	for _, x := range xs {
		ss += (x - mu) * (x - mu)
	}
	return math.Sqrt(ss / float64(len(xs)-1))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// scrapeTimeCollector emits the series the EPP computes at scrape time: the
// per-endpoint queue over every endpoint in the datastore, and, with flow
// control, the pool saturation and stale-endpoint count.
type scrapeTimeCollector struct{ m *eppMetrics }

var (
	perEndpointQueueDesc = prometheus.NewDesc("llm_d_epp_per_endpoint_queue_size", helpText["llm_d_epp_per_endpoint_queue_size"], []string{"model_server_endpoint", "name"}, nil)
	perPodQueueDesc      = prometheus.NewDesc("inference_pool_per_pod_queue_size", helpText["inference_pool_per_pod_queue_size"], []string{"model_server_pod", "name"}, nil)
	saturationDesc       = prometheus.NewDesc("llm_d_epp_flow_control_pool_saturation", helpText["llm_d_epp_flow_control_pool_saturation"], []string{"inference_pool"}, nil)
	saturationLegacyDesc = prometheus.NewDesc("inference_extension_flow_control_pool_saturation", helpText["inference_extension_flow_control_pool_saturation"], []string{"inference_pool"}, nil)
	staleEndpointsDesc   = prometheus.NewDesc("llm_d_epp_flow_control_stale_endpoints", helpText["llm_d_epp_flow_control_stale_endpoints"], []string{"detector"}, nil)
)

func (c scrapeTimeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- perEndpointQueueDesc
	ch <- perPodQueueDesc
	if c.m.s.opts.FlowControl {
		ch <- saturationDesc
		ch <- saturationLegacyDesc
		ch <- staleEndpointsDesc
	}
}

func (c scrapeTimeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.s
	s.mu.Lock()
	engines := append([]*Engine(nil), s.engines...)
	fresh := len(engines)
	if r := s.control.ReadyEndpoints; r != nil {
		fresh = min(*r, fresh)
	}
	s.mu.Unlock()
	pool := s.opts.Pool
	var work, slots float64
	for i, e := range engines {
		l := e.Load()
		ch <- prometheus.MustNewConstMetric(perEndpointQueueDesc, prometheus.GaugeValue, float64(l.Waiting), e.name, pool)
		ch <- prometheus.MustNewConstMetric(perPodQueueDesc, prometheus.GaugeValue, float64(l.Waiting), e.name, pool)
		if i < fresh {
			work += float64(l.Running + l.Waiting)
			slots += float64(l.Slots)
		}
	}
	if !s.opts.FlowControl {
		return
	}
	saturation := 1.0 // an empty pool reads as saturated
	if slots > 0 {
		saturation = round2(work / slots)
	}
	ch <- prometheus.MustNewConstMetric(saturationDesc, prometheus.GaugeValue, saturation, pool)
	ch <- prometheus.MustNewConstMetric(saturationLegacyDesc, prometheus.GaugeValue, saturation, pool)
	ch <- prometheus.MustNewConstMetric(staleEndpointsDesc, prometheus.GaugeValue, float64(len(engines)-fresh), "utilization-detector")
}

// flowQueueChanged tracks the flow-control queue gauge.
func (m *eppMetrics) flowQueueChanged(fairness string, delta float64) {
	if m == nil || m.fcQueue == nil {
		return
	}
	ls := []string{fairness, m.s.opts.Pool, m.s.opts.Model, eppPriority, m.s.opts.Model}
	m.fcQueue.WithLabelValues(ls...).Add(delta)
	m.fcQueueLegacy.WithLabelValues(ls...).Add(delta)
}

// eppRequest records one request's life in the EPP's metrics. A nil
// *eppRequest (non-EPP sims) records nothing.
type eppRequest struct {
	m        *eppMetrics
	received time.Time
	model    string
	fairness string // metrics label: the header, or default-flow
	rawFair  string // in-flight producer label: the raw header value
	endpoint string
	prompt   int
	first    time.Time
	mu       sync.Mutex
	ended    bool
}

func (m *eppMetrics) begin(model, fairnessHeader string) *eppRequest {
	fair := fairnessHeader
	if fair == "" {
		fair = defaultFairness
	}
	if m == nil {
		return &eppRequest{fairness: fair}
	}
	r := &eppRequest{m: m, received: m.s.clk.Now(), model: model, fairness: fair, rawFair: fairnessHeader}
	m.reqTotal.WithLabelValues(r.labels()...).Inc()
	m.reqTotalLegacy.WithLabelValues(model, eppPriority, model).Inc()
	m.running.WithLabelValues(r.labels()...).Inc()
	m.runningLegacy.WithLabelValues(model).Inc()
	return r
}

func (r *eppRequest) labels() []string { return []string{r.fairness, r.model, eppPriority, r.model} }

func (r *eppRequest) inflightLabels() []string {
	return []string{r.endpoint, r.rawFair, eppNamespace, eppPriority, eppProducerName}
}

func (r *eppRequest) dispatched(endpoint string, prompt int) {
	if r.m == nil {
		return
	}
	r.endpoint, r.prompt = endpoint, prompt
	r.m.inflightReqs.WithLabelValues(r.inflightLabels()...).Inc()
	r.m.inflightTokens.WithLabelValues(r.inflightLabels()...).Add(float64(prompt))
}

// firstByte notes the first response byte; a streaming request's prompt
// tokens leave the in-flight token count here.
func (r *eppRequest) firstByte(t time.Time) {
	if r.m == nil || !r.first.IsZero() {
		return
	}
	r.first = t
	if r.endpoint != "" {
		r.m.inflightTokens.WithLabelValues(r.inflightLabels()...).Sub(float64(r.prompt))
		r.prompt = 0
	}
}

// end closes the request's gauges once, however it ended.
func (r *eppRequest) end() bool {
	if r.m == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return false
	}
	r.ended = true
	r.m.running.WithLabelValues(r.labels()...).Dec()
	r.m.runningLegacy.WithLabelValues(r.model).Dec()
	if r.endpoint != "" {
		r.m.inflightReqs.WithLabelValues(r.inflightLabels()...).Dec()
		r.m.inflightTokens.WithLabelValues(r.inflightLabels()...).Sub(float64(r.prompt))
	}
	return true
}

func (r *eppRequest) fail(code string) {
	if !r.end() {
		return
	}
	r.m.errTotal.WithLabelValues(append([]string{code}, r.labels()...)...).Inc()
	r.m.errTotalLegacy.WithLabelValues(code, r.model, r.model).Inc()
}

func (r *eppRequest) abort() { r.end() }

// done records a success: duration, TTFT (from receipt to the first byte)
// and, for streams, TPOT = (e2e - TTFT) / (tokens - 1).
func (r *eppRequest) done(stream bool, tm timing) {
	if !r.end() {
		return
	}
	now := r.m.s.clk.Now()
	e2e := now.Sub(r.received).Seconds()
	r.m.duration.WithLabelValues(r.labels()...).Observe(e2e)
	r.m.durationLegacy.WithLabelValues(r.model, r.model).Observe(e2e)
	ttft := e2e
	if stream && !r.first.IsZero() {
		ttft = r.first.Sub(r.received).Seconds()
	}
	r.m.ttft.WithLabelValues(append([]string{strconv.FormatBool(stream)}, r.labels()...)...).Observe(ttft)
	if stream && tm.tokens > 1 {
		r.m.tpot.WithLabelValues(r.labels()...).Observe((e2e - ttft) / float64(tm.tokens-1))
	}
}
