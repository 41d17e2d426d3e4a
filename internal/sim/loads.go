package sim

import (
	"bufio"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// SGLang's GET /v1/loads, in the current schema (after sglang PR #26348) or,
// with LegacyLoads, the January–May 2026 one with dp_rank_count, aggregate and
// num_total_reqs. Struct field order is the upstream key order.

type loadsCurrent struct {
	Timestamp       string        `json:"timestamp"`
	Version         string        `json:"version"`
	Accelerator     string        `json:"accelerator"`
	NumAccelerators int           `json:"num_accelerators"`
	Loads           []rankCurrent `json:"loads"`
}

type rankCurrent struct {
	DPRank                   int            `json:"dp_rank"`
	NumRunningReqs           int            `json:"num_running_reqs"`
	NumWaitingReqs           int            `json:"num_waiting_reqs"`
	NumWaitingUncachedTokens int            `json:"num_waiting_uncached_tokens"`
	NumUsedTokens            int            `json:"num_used_tokens"`
	NumTotalTokens           int            `json:"num_total_tokens"`
	MaxTotalNumTokens        int            `json:"max_total_num_tokens"`
	MaxRunningRequests       int            `json:"max_running_requests"`
	TokenUsage               float64        `json:"token_usage"`
	GenThroughput            float64        `json:"gen_throughput"`
	CacheHitRate             float64        `json:"cache_hit_rate"`
	Utilization              float64        `json:"utilization"`
	Memory                   *memorySection `json:"memory,omitempty"`
	Disaggregation           *disaggCurrent `json:"disaggregation,omitempty"`
	Queues                   *queuesSection `json:"queues,omitempty"`
}

type memorySection struct {
	WeightGB      float64 `json:"weight_gb"`
	KVCacheGB     float64 `json:"kv_cache_gb"`
	GraphGB       float64 `json:"graph_gb"`
	TokenCapacity int     `json:"token_capacity"`
}

type disaggCurrent struct {
	Mode                      string  `json:"mode"`
	PrefillBootstrapQueueReqs int     `json:"prefill_bootstrap_queue_reqs"`
	PrefillInflightQueueReqs  int     `json:"prefill_inflight_queue_reqs"`
	DecodePreallocQueueReqs   int     `json:"decode_prealloc_queue_reqs"`
	DecodeTransferQueueReqs   int     `json:"decode_transfer_queue_reqs"`
	DecodeRetractedQueueReqs  int     `json:"decode_retracted_queue_reqs"`
	KVTransferSpeedGBs        float64 `json:"kv_transfer_speed_gb_s"`
	KVTransferLatencyMs       float64 `json:"kv_transfer_latency_ms"`
}

type queuesSection struct {
	Waiting   int `json:"waiting"`
	Grammar   int `json:"grammar"`
	Paused    int `json:"paused"`
	Retracted int `json:"retracted"`
}

type loadsLegacy struct {
	Timestamp   string       `json:"timestamp"`
	Version     string       `json:"version"`
	DPRankCount int          `json:"dp_rank_count"`
	Loads       []rankLegacy `json:"loads"`
	Aggregate   aggregate    `json:"aggregate"`
}

type rankLegacy struct {
	DPRank             int            `json:"dp_rank"`
	NumRunningReqs     int            `json:"num_running_reqs"`
	NumWaitingReqs     int            `json:"num_waiting_reqs"`
	NumUsedTokens      int            `json:"num_used_tokens"`
	NumTotalTokens     int            `json:"num_total_tokens"`
	MaxTotalNumTokens  int            `json:"max_total_num_tokens"`
	TokenUsage         float64        `json:"token_usage"`
	GenThroughput      float64        `json:"gen_throughput"`
	CacheHitRate       float64        `json:"cache_hit_rate"`
	Utilization        float64        `json:"utilization"`
	MaxRunningRequests int            `json:"max_running_requests"`
	Memory             *memorySection `json:"memory,omitempty"`
	Disaggregation     *disaggLegacy  `json:"disaggregation,omitempty"`
	Queues             *queuesSection `json:"queues,omitempty"`
	NumTotalReqs       int            `json:"num_total_reqs"`
}

type disaggLegacy struct {
	Mode                     string  `json:"mode"`
	PrefillPreallocQueueReqs int     `json:"prefill_prealloc_queue_reqs"`
	PrefillInflightQueueReqs int     `json:"prefill_inflight_queue_reqs"`
	DecodePreallocQueueReqs  int     `json:"decode_prealloc_queue_reqs"`
	DecodeTransferQueueReqs  int     `json:"decode_transfer_queue_reqs"`
	DecodeRetractedQueueReqs int     `json:"decode_retracted_queue_reqs"`
	KVTransferSpeedGBs       float64 `json:"kv_transfer_speed_gb_s"`
	KVTransferLatencyMs      float64 `json:"kv_transfer_latency_ms"`
}

type aggregate struct {
	TotalRunningReqs int     `json:"total_running_reqs"`
	TotalWaitingReqs int     `json:"total_waiting_reqs"`
	TotalReqs        int     `json:"total_reqs"`
	TotalUsedTokens  int     `json:"total_used_tokens"`
	TotalTokens      int     `json:"total_tokens"`
	AvgTokenUsage    float64 `json:"avg_token_usage"`
	AvgThroughput    float64 `json:"avg_throughput"`
	AvgUtilization   float64 `json:"avg_utilization"`
}

var loadsSections = []string{"all", "core", "disagg", "lora", "memory", "queues", "spec"}

// parseInclude reads include= as SGLang does: a comma list; "all" selects
// every section; an unknown name is an error listing the bad ones.
func parseInclude(q string) (map[string]bool, error) {
	if q == "" {
		q = "all"
	}
	sel := map[string]bool{}
	var bad []string
	for _, part := range strings.Split(q, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if !slices.Contains(loadsSections, part) {
			bad = append(bad, "'"+part+"'")
			continue
		}
		sel[part] = true
	}
	if len(bad) > 0 {
		quoted := make([]string, len(loadsSections))
		for i, s := range loadsSections {
			quoted[i] = "'" + s + "'"
		}
		//lint:ignore ST1005 the message is SGLang's own, word for word
		return nil, fmt.Errorf("Invalid include sections: {%s}. Valid options: [%s]", strings.Join(bad, ", "), strings.Join(quoted, ", "))
	}
	if sel["all"] {
		for _, s := range loadsSections {
			sel[s] = true
		}
	}
	return sel, nil
}

func (s *Sim) handleLoads(w http.ResponseWriter, r *http.Request) {
	if st := s.state().LoadsStatus; st != 0 && st != http.StatusOK {
		writeJSON(w, st, map[string]string{"detail": http.StatusText(st)})
		return
	}
	q := r.URL.Query()
	sel, err := parseInclude(q.Get("include"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"detail": err.Error()})
		return
	}
	rank := -1
	if v := q.Get("dp_rank"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []any{map[string]any{
				"type": "int_parsing", "loc": []string{"query", "dp_rank"},
				"msg": "Input should be a valid integer, unable to parse string as an integer", "input": v,
			}}})
			return
		}
		rank = n
	}
	format := q.Get("format")
	if format != "" && format != "json" && format != "prometheus" {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []any{map[string]any{
			"type": "literal_error", "loc": []string{"query", "format"},
			"msg": "Input should be 'json' or 'prometheus'", "input": format,
		}}})
		return
	}
	engines := s.Engines()
	now := s.clk.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00")
	ranks := make([]rankCurrent, 0, len(engines))
	for i, e := range engines {
		if rank >= 0 && rank != i {
			continue
		}
		ranks = append(ranks, currentRank(i, e.Load(), sel))
	}
	if format == "prometheus" {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		writeLoadsPrometheus(w, ranks)
		return
	}
	if !s.opts.LegacyLoads {
		writeJSON(w, http.StatusOK, loadsCurrent{
			Timestamp: now, Version: "0.5.18", Accelerator: "Simulated GPU", NumAccelerators: 1, Loads: ranks,
		})
		return
	}
	out := loadsLegacy{Timestamp: now, Version: "0.5.10", DPRankCount: len(engines), Loads: []rankLegacy{}}
	var agg aggregate
	for _, c := range ranks {
		l := rankLegacy{
			DPRank: c.DPRank, NumRunningReqs: c.NumRunningReqs, NumWaitingReqs: c.NumWaitingReqs,
			NumUsedTokens: c.NumUsedTokens, NumTotalTokens: c.NumTotalTokens, MaxTotalNumTokens: c.MaxTotalNumTokens,
			TokenUsage: c.TokenUsage, GenThroughput: c.GenThroughput, CacheHitRate: c.CacheHitRate,
			Utilization: c.Utilization, MaxRunningRequests: c.MaxRunningRequests, Memory: c.Memory, Queues: c.Queues,
			NumTotalReqs: c.NumRunningReqs + c.NumWaitingReqs,
		}
		if c.Disaggregation != nil {
			l.Disaggregation = &disaggLegacy{Mode: "null"}
		}
		out.Loads = append(out.Loads, l)
		agg.TotalRunningReqs += c.NumRunningReqs
		agg.TotalWaitingReqs += c.NumWaitingReqs
		agg.TotalUsedTokens += c.NumUsedTokens
		agg.TotalTokens += c.NumTotalTokens
		agg.AvgTokenUsage += c.TokenUsage
		agg.AvgThroughput += c.GenThroughput
	}
	agg.TotalReqs = agg.TotalRunningReqs + agg.TotalWaitingReqs
	if n := float64(len(ranks)); n > 0 {
		agg.AvgTokenUsage = round4(agg.AvgTokenUsage / n)
		agg.AvgThroughput = round2(agg.AvgThroughput / n)
	}
	out.Aggregate = agg
	writeJSON(w, http.StatusOK, out)
}

func currentRank(i int, l Load, sel map[string]bool) rankCurrent {
	r := rankCurrent{
		DPRank: i, NumRunningReqs: l.Running, NumWaitingReqs: l.Waiting,
		NumWaitingUncachedTokens: l.WaitingTokens, NumUsedTokens: l.KVUsed,
		NumTotalTokens: l.KVUsed + l.WaitingTokens, MaxTotalNumTokens: l.KVCapacity,
		MaxRunningRequests: l.Slots, TokenUsage: round4(l.KVUsage()), GenThroughput: round2(l.GenThroughput),
		CacheHitRate: round4(l.CacheHitRate()),
	}
	if sel["memory"] {
		// The KV pool size follows the token capacity at 2 bytes × 64 KiB a
		// token, the order of a Qwen3-8B engine.
		r.Memory = &memorySection{WeightGB: 15.262, KVCacheGB: round2(float64(l.KVCapacity) * 0.000144), GraphGB: 1.874, TokenCapacity: l.KVCapacity}
	}
	if sel["disagg"] {
		r.Disaggregation = &disaggCurrent{Mode: "null"}
	}
	if sel["queues"] {
		r.Queues = &queuesSection{Waiting: l.Waiting}
	}
	return r
}

// writeLoadsPrometheus renders format=prometheus: sglang_<key>{dp_rank} for
// each numeric core field and sglang_<section>_<key> for sections.
func writeLoadsPrometheus(w http.ResponseWriter, ranks []rankCurrent) {
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	emit := func(prefix string, v reflect.Value, rank int) {
		t := v.Type()
		for i := range t.NumField() {
			key, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			f := v.Field(i)
			var val float64
			switch f.Kind() {
			case reflect.Int:
				val = float64(f.Int())
			case reflect.Float64:
				val = f.Float()
			default:
				continue
			}
			if key == "dp_rank" {
				continue
			}
			fmt.Fprintf(bw, "sglang_%s%s{dp_rank=\"%d\"} %s\n", prefix, key, rank, pyFloat(val))
		}
	}
	for _, r := range ranks {
		emit("", reflect.ValueOf(r), r.DPRank)
		if r.Memory != nil {
			emit("memory_", reflect.ValueOf(*r.Memory), r.DPRank)
		}
		if r.Disaggregation != nil {
			emit("disagg_", reflect.ValueOf(*r.Disaggregation), r.DPRank)
		}
		if r.Queues != nil {
			emit("queues_", reflect.ValueOf(*r.Queues), r.DPRank)
		}
	}
}
