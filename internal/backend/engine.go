package backend

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/readiness"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/signals/expo"
)

// probeOutcome is the tri-state result of asking an engine for /v1/loads.
type probeOutcome int

const (
	// probeAvailable: a load response with at least one rank.
	probeAvailable probeOutcome = iota
	// probeAbsent: 404, 405, 501, or a 2xx that is not a load response.
	// Definitive: memoized.
	probeAbsent
	// probeInconclusive: transport error, timeout, 5xx, 401/403, or a load
	// response with no ranks yet. Never memoized; asked again next time.
	probeInconclusive
)

// loadsResponse accepts both /v1/loads eras: with or without dp_rank_count
// and aggregate, and either name of the PD prefill queue.
type loadsResponse struct {
	DPRankCount *int       `json:"dp_rank_count"`
	Loads       []rankLoad `json:"loads"`
}

type rankLoad struct {
	DPRank                   int      `json:"dp_rank"`
	NumRunningReqs           *float64 `json:"num_running_reqs"`
	NumWaitingReqs           *float64 `json:"num_waiting_reqs"`
	NumWaitingUncachedTokens float64  `json:"num_waiting_uncached_tokens"`
	TokenUsage               float64  `json:"token_usage"`
	GenThroughput            float64  `json:"gen_throughput"`
	MaxRunningRequests       float64  `json:"max_running_requests"`
	Disaggregation           *struct {
		PrefillBootstrapQueueReqs float64 `json:"prefill_bootstrap_queue_reqs"`
		PrefillPreallocQueueReqs  float64 `json:"prefill_prealloc_queue_reqs"`
		PrefillInflightQueueReqs  float64 `json:"prefill_inflight_queue_reqs"`
		DecodePreallocQueueReqs   float64 `json:"decode_prealloc_queue_reqs"`
		DecodeTransferQueueReqs   float64 `json:"decode_transfer_queue_reqs"`
		DecodeRetractedQueueReqs  float64 `json:"decode_retracted_queue_reqs"`
	} `json:"disaggregation"`
}

// DecodeLoads classifies a 2xx /v1/loads body: Available with the decoded
// response; Absent when it is not a load response at all (something else is
// mounted there); Inconclusive when it is one but has no ranks yet, or
// carries numbers no engine would report (negative, not finite), which says
// nothing definitive about the route.
func DecodeLoads(body []byte) (*loadsResponse, probeOutcome, string) {
	var r loadsResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, probeAbsent, fmt.Sprintf("2xx body is not a load response: %v", err)
	}
	if r.Loads == nil {
		return nil, probeAbsent, "2xx body has no loads array"
	}
	if len(r.Loads) == 0 {
		return nil, probeInconclusive, "load response lists no ranks yet"
	}
	for _, l := range r.Loads {
		if l.NumRunningReqs == nil || l.NumWaitingReqs == nil {
			return nil, probeAbsent, "load response rank lacks num_running_reqs or num_waiting_reqs"
		}
		for _, v := range []float64{*l.NumRunningReqs, *l.NumWaitingReqs, l.NumWaitingUncachedTokens, l.TokenUsage, l.GenThroughput, l.MaxRunningRequests} {
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, probeInconclusive, "load response carries a negative or non-finite value"
			}
		}
	}
	return &r, probeAvailable, ""
}

// engineLoad sums a load response over its DP ranks.
func (r *loadsResponse) engineLoad() *EngineLoad {
	e := &EngineLoad{Ranks: len(r.Loads), Known: FieldWaitingUncached | FieldTokenUsage | FieldGenThroughput | FieldMaxRunning}
	for _, l := range r.Loads {
		// The engine's limit is its ranks' together, known only when every
		// rank says its own: older engines send 0 or nothing.
		if l.MaxRunningRequests < 1 {
			e.Known &^= FieldMaxRunning
		}
		e.MaxRunning += l.MaxRunningRequests
		e.Running += *l.NumRunningReqs
		e.Waiting += *l.NumWaitingReqs
		e.WaitingUncachedTokens += l.NumWaitingUncachedTokens
		e.TokenUsage += l.TokenUsage
		e.GenThroughput += l.GenThroughput
		if d := l.Disaggregation; d != nil {
			e.Known |= FieldDisaggregation
			e.PrefillQueue += d.PrefillBootstrapQueueReqs + d.PrefillPreallocQueueReqs + d.PrefillInflightQueueReqs
			e.DecodeQueue += d.DecodePreallocQueueReqs + d.DecodeTransferQueueReqs + d.DecodeRetractedQueueReqs
		}
	}
	if e.Ranks > 0 {
		e.TokenUsage /= float64(e.Ranks)
	}
	return e
}

// ReprobeAfter is how long an absence is remembered: an engine upgraded in
// place may have gained /v1/loads, and asking every ten minutes costs
// nothing worth counting.
const ReprobeAfter = 10 * time.Minute

// ProbeMemo remembers which /v1/loads URLs are definitively absent, so an
// engine without the endpoint is asked rarely, not every scrape. An absence
// is forgotten after ReprobeAfter, when the engine behind the URL was
// replaced (Forget: a failed scrape followed by a good one), or when its
// provider changes; an engine is marked absent only while its provider is
// ready, since an engine starting up may answer 404 for routes it has not
// registered yet.
type ProbeMemo struct {
	clk clock.Clock
	// expired counts absences forgotten for age; the operator exports it.
	expired func(url string)
	mu      sync.Mutex
	absent  map[string]time.Time // url -> when it was found absent
}

// NewProbeMemo returns an empty memo on clk; expired, if not nil, is told of
// every absence forgotten for age.
func NewProbeMemo(clk clock.Clock, expired func(url string)) *ProbeMemo {
	return &ProbeMemo{clk: clk, expired: expired, absent: map[string]time.Time{}}
}

func (m *ProbeMemo) isAbsent(url string) bool {
	m.mu.Lock()
	at, ok := m.absent[url]
	if ok && m.clk.Now().Sub(at) >= ReprobeAfter {
		delete(m.absent, url)
		ok = false
		defer m.notifyExpired(url)
	}
	m.mu.Unlock()
	return ok
}

func (m *ProbeMemo) notifyExpired(url string) {
	if m.expired != nil {
		m.expired(url)
	}
}

func (m *ProbeMemo) markAbsent(url string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.absent[url] = m.clk.Now()
}

// Absent reports whether url is remembered absent.
func (m *ProbeMemo) Absent(url string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.absent[url]
	return ok
}

// Forget drops one URL: its provider changed or went away, so the endpoint
// may be there now.
func (m *ProbeMemo) Forget(url string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.absent, url)
}

// Clear drops everything (a configuration reload).
func (m *ProbeMemo) Clear() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.absent)
}

// Len is the number of memoized absences.
func (m *ProbeMemo) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.absent)
}

// fromEngine turns an engine's load into the pool contract: one engine is
// one ready endpoint, its running and waiting are the pool averages, its KV
// usage the pool's, and its queue the one endpoint's queue.
func fromEngine(name string, e *EngineLoad, source string) *Reading {
	direct := e.Running + e.Waiting
	running, waiting := e.Running, e.Waiting
	pool := []signals.Label{{Name: "name", Value: name}}
	return &Reading{
		Source: source,
		Result: ResultSuccess,
		Ready:  readiness.Known(1),
		// An engine's queue series stands for the per-unit series of a pool.
		UnitsReporting: true,
		Rows: []signals.Row{
			{Name: signals.EPPReadyEndpoints, Labels: pool, Value: 1},
			{Name: signals.EPPAverageRunning, Labels: pool, Value: e.Running},
			{Name: signals.EPPAverageQueue, Labels: pool, Value: e.Waiting},
			{Name: signals.EPPAverageKV, Labels: pool, Value: e.TokenUsage},
			{Name: signals.EPPPerEndpointQueue, Labels: []signals.Label{{Name: "model_server_endpoint", Value: name}, {Name: "name", Value: name}}, Value: e.Waiting},
		},
		Load:   engineLoad(e, direct, running, waiting),
		Engine: e,
	}
}

// engineLoad is what an engine's in-flight and prefill backlog are read
// from.
func engineLoad(e *EngineLoad, direct, running, waiting float64) Load {
	l := Load{Direct: &direct, AverageRunning: &running, AverageQueue: &waiting}
	if e.Known&FieldWaitingUncached != 0 {
		tokens := e.WaitingUncachedTokens
		l.PrefillTokens = &tokens
	}
	if e.Known&FieldMaxRunning != 0 {
		limit := e.MaxRunning
		l.MaxRunning = &limit
	}
	return l
}

// Gauge names of the /metrics fallbacks, normalized (':' read as '_').
var engineGauges = expo.NewNameSet(
	"vllm:num_requests_running", "vllm:num_requests_waiting", // 0, 1
	"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", // 2, 3
	"sglang:num_running_reqs", "sglang:num_queue_reqs", // 4, 5
	"sglang:token_usage", "sglang:gen_throughput", // 6, 7
)

// ParseEngineMetrics reads an engine's /metrics by kind: vllm gauges (summed
// over engine, KV averaged), sglang gauges, or for auto the sglang shape then
// the vllm one. ok is false when no shape is there: load unknown, not zero.
func ParseEngineMetrics(body []byte, kind string) (e *EngineLoad, ok bool, err error) {
	var sum [8]float64
	var n [8]int
	_, err = expo.Scan(body, engineGauges.Has, func(s *expo.Sample) {
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) || s.Value < 0 {
			return
		}
		i := engineGauges.Index(s.Name)
		sum[i] += s.Value
		n[i]++
	})
	if err != nil {
		return nil, false, &Error{ClassParse, err}
	}
	mean := func(i int) float64 { return sum[i] / float64(max(n[i], 1)) }
	sglang := func() (*EngineLoad, bool) {
		if n[6] == 0 { // SMG detects the shape by its token_usage gauge
			return nil, false
		}
		e := &EngineLoad{Known: FieldTokenUsage, Ranks: n[6], Running: sum[4], Waiting: sum[5], TokenUsage: mean(6), GenThroughput: sum[7]}
		if n[7] > 0 {
			e.Known |= FieldGenThroughput
		}
		return e, true
	}
	vllm := func() (*EngineLoad, bool) {
		kv := 2
		if n[kv] == 0 {
			kv = 3 // the name before vLLM 0.9
		}
		if n[kv] == 0 { // without a KV gauge there is no vLLM load
			return nil, false
		}
		return &EngineLoad{Known: FieldTokenUsage, Ranks: n[kv], Running: sum[0], Waiting: sum[1], TokenUsage: mean(kv)}, true
	}
	switch kind {
	case "vllm":
		e, ok = vllm()
	case "sglang":
		e, ok = sglang()
	default:
		if e, ok = sglang(); !ok {
			e, ok = vllm()
		}
	}
	return e, ok, nil
}

func noLoad(kind string) *Reading {
	return &Reading{
		Source:  SourceMetrics,
		Result:  ResultNoSeries,
		Missing: fmt.Sprintf("engine reachable, but neither /v1/loads nor a %s load shape on /metrics", kind),
	}
}
