package backend

import (
	"github.com/grid-inference/grid/internal/latency"
	"github.com/grid-inference/grid/internal/readiness"
	"github.com/grid-inference/grid/internal/signals"
)

// Sources of a reading.
const (
	SourceMetrics = "metrics"
	SourceLoads   = "loads"
)

// Reading is what one successful scrape of a provider says.
type Reading struct {
	// Source is where the load came from: /metrics or /v1/loads.
	Source string
	// Result is success, no_series, or body_cap (the endpoint answered
	// past the cap; readiness is unknown, the provider not declared down).
	Result string
	// Ready is the ready-endpoint count, before the readiness thaw.
	Ready readiness.Count
	// Missing explains an unknown count.
	Missing string
	// UnitsReporting marks a scrape that carried per-unit queue series for
	// the pool (the thaw rule watches them stop).
	UnitsReporting bool
	// MultiPool marks an EPP serving several pools: its latency and
	// per-endpoint in-flight cannot be attributed to this one.
	MultiPool bool
	// Rows are the contract series to publish, as scraped (no attribution).
	Rows []signals.Row
	// Load holds the in-flight inputs.
	Load Load
	// Latency is the EPP's cumulative request counters, when present.
	Latency *latency.Snapshot
	// Engine is the extra load an engine reports, when it was read.
	Engine *EngineLoad
}

// Load holds what in-flight is estimated from (docs/protocol.md §4.4).
type Load struct {
	// EPPCount is the per-endpoint in-flight count: each endpoint's largest
	// count across producers, summed. Nil when absent or multi-pool.
	EPPCount *float64
	// AverageRunning and AverageQueue are the pool's per-endpoint averages.
	AverageRunning *float64
	AverageQueue   *float64
	// FlowControl is what the EPP's flow control holds for the pool.
	FlowControl float64
	// Direct is an engine's own running plus waiting, when read from one.
	Direct *float64
	// PrefillTokens is the uncached prompt tokens the provider holds that
	// have not had their first token yet: the EPP's in-flight tokens
	// (each endpoint's largest count across producers, summed; the EPP
	// releases a streamed request's prompt at its first byte), or an
	// SGLang engine's num_waiting_uncached_tokens over its ranks. Nil
	// where the backend says nothing of it (vLLM).
	PrefillTokens *float64
	// MaxRunning is the most requests one ready unit runs at once, as the
	// backend declares it: an SGLang engine's max_running_requests over
	// its ranks. Nil where the backend says nothing of it (vLLM, the EPP).
	MaxRunning *float64
}

// InFlight estimates the requests the provider holds, given its ready count
// after the thaw: the larger of the EPP count and (average running + average
// queued) × ready, plus flow control. Unknown (false) when neither estimate
// exists or no endpoint is fresh, since the averages are then frozen.
func (l *Load) InFlight(ready readiness.Count) (float64, bool) {
	if l.Direct != nil {
		return *l.Direct, true
	}
	if !ready.Known || ready.Value <= 0 {
		return 0, false
	}
	var held float64
	have := false
	if l.EPPCount != nil {
		held, have = *l.EPPCount, true
	}
	if l.AverageRunning != nil && l.AverageQueue != nil {
		if avg := (*l.AverageRunning + *l.AverageQueue) * ready.Value; !have || avg > held {
			held = avg
		}
		have = true
	}
	if !have {
		return 0, false
	}
	return held + l.FlowControl, true
}

// EngineFields names the readings of an EngineLoad beyond running and
// waiting, which not every source gives: /v1/loads gives all but the
// disaggregation queues of an engine that does not disaggregate, vLLM's
// /metrics only the token usage.
type EngineFields uint8

// The optional engine readings.
const (
	FieldWaitingUncached EngineFields = 1 << iota
	FieldTokenUsage
	FieldGenThroughput
	FieldDisaggregation // PrefillQueue and DecodeQueue
	FieldMaxRunning     // MaxRunning
)

// EngineLoad is what an engine reports beyond the pool contract, mostly
// from /v1/loads, which /metrics cannot give.
type EngineLoad struct {
	// Known marks the optional readings the source gave; the others are
	// unknown, not zero, and are not exported.
	Known                 EngineFields
	Ranks                 int
	Running               float64
	Waiting               float64
	WaitingUncachedTokens float64
	TokenUsage            float64
	GenThroughput         float64
	PrefillQueue          float64 // disaggregation: bootstrap/prealloc + inflight
	DecodeQueue           float64 // disaggregation: prealloc + transfer + retracted
	MaxRunning            float64 // the ranks' max_running_requests together
}
