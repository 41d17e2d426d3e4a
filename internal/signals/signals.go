// Package signals holds Grid's cross-site contract: the series a site
// publishes about its providers, the attribution labels, the batch metadata
// line, and the rendering of rows on the wire (docs/protocol.md §2.1–§2.3).
package signals

import (
	"slices"
	"strconv"
	"strings"
)

// Attribution labels every row carries.
const (
	LabelSite     = "grid_site"
	LabelProvider = "grid_provider"
)

// Series the operator concludes about each provider.
const (
	Ready          = "grid_provider_ready"
	ReadyEndpoints = "grid_provider_ready_endpoints"
	InFlight       = "grid_provider_in_flight_requests"
	TTFTP50        = "grid_provider_ttft_p50_seconds"
	TTFTP90        = "grid_provider_ttft_p90_seconds"
	TPOT           = "grid_provider_tpot_seconds"
	ErrorRatio     = "grid_provider_error_ratio"
	// PrefillBacklog is the uncached prompt tokens the provider holds that
	// have not had their first token: what a new request waits behind to
	// be prefilled (docs/protocol.md §2.2). Published where the backend
	// says it (the EPP's in-flight tokens, SGLang's waiting uncached
	// tokens); a receiver that does not know it drops it, counted, and
	// one that gets none reads the provider by its request counts.
	PrefillBacklog = "grid_provider_prefill_backlog_tokens"
	// MaxRunning is the most requests one ready unit of the provider (an
	// endpoint of a pool, an engine) runs at once, as the operator is
	// configured (`maxRunning`) or the engine declares it (SGLang's
	// max_running_requests): a gateway reads no more undemonstrated
	// capacity into a unit than this (docs/protocol.md §2.2). Absent where
	// neither says it.
	MaxRunning = "grid_provider_max_running_requests"
	// ConfigGeneration is the batch metadata line (§2.3).
	ConfigGeneration = "grid_provider_config_generation"
	// Info declares what a provider serves: label model, value 1. It is how
	// a gateway learns which models a remote site's providers serve; it is
	// keyed, like every row, on the verified identity of the site.
	Info = "grid_provider_info"
	// LabelModel carries the model name on Info rows.
	LabelModel = "model"
)

// ProviderSeries are the seven per-provider conclusions, in export order.
var ProviderSeries = []string{Ready, ReadyEndpoints, InFlight, TTFTP50, TTFTP90, TPOT, ErrorRatio}

// Raw EPP pool series relayed as they were scraped.
const (
	EPPReadyEndpoints    = "llm_d_epp_ready_endpoints"
	LegacyReadyPods      = "inference_pool_ready_pods"
	EPPAverageRunning    = "llm_d_epp_average_running_requests"
	LegacyAverageRunning = "inference_pool_average_running_requests"
	EPPAverageQueue      = "llm_d_epp_average_queue_size"
	LegacyAverageQueue   = "inference_pool_average_queue_size"
	EPPAverageKV         = "llm_d_epp_average_kv_cache_utilization"
	LegacyAverageKV      = "inference_pool_average_kv_cache_utilization"
	EPPStdDevKV          = "llm_d_epp_std_dev_kv_cache_utilization"
	EPPFlowControlQueue  = "llm_d_epp_flow_control_queue_size"
	EPPPerEndpointQueue  = "llm_d_epp_per_endpoint_queue_size"
	LegacyPerPodQueue    = "inference_pool_per_pod_queue_size"
)

// ContractNames are every series a site may publish to its peers and relay
// to its gateway: the reference's PEER_SIGNAL_NAMES, the batch metadata line,
// the EPP's KV standard deviation, which the gateway reads as the "spread" of
// the seed's KV-cache term, and the provider info line that names the model
// (decisions recorded in docs/signals.md).
var ContractNames = []string{
	Ready, ReadyEndpoints, InFlight, TTFTP50, TTFTP90, TPOT, ErrorRatio, PrefillBacklog, MaxRunning,
	LegacyAverageQueue, EPPAverageQueue, LegacyAverageRunning, EPPAverageRunning,
	LegacyAverageKV, EPPAverageKV, EPPReadyEndpoints, LegacyReadyPods,
	EPPFlowControlQueue, LegacyPerPodQueue, EPPPerEndpointQueue,
	EPPStdDevKV, ConfigGeneration, Info,
}

// IsContract reports whether name is a contract series.
func IsContract(name string) bool { return slices.Contains(ContractNames, name) }

// Label is one label pair.
type Label struct {
	Name, Value string
}

// Row is one published sample.
type Row struct {
	Name   string
	Labels []Label // sorted by name when rendered
	Value  float64
}

// Label returns a label's value.
func (r *Row) Label(name string) (string, bool) {
	for _, l := range r.Labels {
		if l.Name == name {
			return l.Value, true
		}
	}
	return "", false
}

// SortLabels orders labels by name, the wire order.
func SortLabels(ls []Label) {
	slices.SortFunc(ls, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
}

// AppendLine appends `name{labels} value stamp\n` to b: labels in the order
// given (callers keep them sorted), values in shortest round-trip decimal
// without an exponent, the stamp in epoch milliseconds.
func AppendLine(b []byte, r *Row, stampMs int64) []byte {
	b = append(b, r.Name...)
	b = append(b, '{')
	for i, l := range r.Labels {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, l.Name...)
		b = append(b, '=', '"')
		b = appendEscaped(b, l.Value)
		b = append(b, '"')
	}
	b = append(b, '}', ' ')
	b = strconv.AppendFloat(b, r.Value, 'f', -1, 64)
	b = append(b, ' ')
	b = strconv.AppendInt(b, stampMs, 10)
	return append(b, '\n')
}

func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, '\\', '\\')
		case '"':
			b = append(b, '\\', '"')
		case '\n':
			b = append(b, '\\', 'n')
		default:
			b = append(b, c)
		}
	}
	return b
}

// LabelAdmission carries a provider's admission on its Info row, absent
// when it takes every request (docs/protocol.md §2.2), so a provider that
// sets none renders the rows an older peer expects.
const LabelAdmission = "admission"

// Admission says which requests a provider takes. Its operator's
// configuration sets it; the Info row relays it to every gateway.
type Admission string

// Admissions, named as the reference's candidate list names them.
const (
	// AdmitNewAndExisting takes every request: the default.
	AdmitNewAndExisting Admission = "new_and_existing"
	// AdmitExistingOnly keeps serving the sessions bound to it and takes
	// no new one: a site draining gracefully.
	AdmitExistingOnly Admission = "existing_only"
	// AdmitNone takes nothing, bound sessions included.
	AdmitNone Admission = "none"
)

// ParseAdmission reads an admission; "" is the default.
func ParseAdmission(s string) (Admission, bool) {
	switch a := Admission(s); a {
	case "", AdmitNewAndExisting:
		return AdmitNewAndExisting, true
	case AdmitExistingOnly, AdmitNone:
		return a, true
	}
	return "", false
}
