package gateway_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The series of docs/protocol.md §5 that Grid exports, with their labels. The
// two it does not export (serving-config reloads, model discovery) are
// named, with the reason, in docs/gateway.md.
var (
	operatorSeries = map[string]string{
		"grid_provider_ready":                                 "grid_provider,grid_site",
		"grid_provider_ready_endpoints":                       "grid_provider,grid_site",
		"grid_provider_in_flight_requests":                    "grid_provider,grid_site",
		"grid_provider_ttft_p50_seconds":                      "grid_provider,grid_site",
		"grid_provider_ttft_p90_seconds":                      "grid_provider,grid_site",
		"grid_provider_tpot_seconds":                          "grid_provider,grid_site",
		"grid_provider_error_ratio":                           "grid_provider,grid_site",
		"grid_provider_scrape_total":                          "grid_provider,result",
		"grid_provider_last_scrape_success_timestamp_seconds": "grid_provider",
		"grid_peer_poll_total":                                "outcome,peer",
		"grid_peer_poll_duration_seconds":                     "peer",
		"grid_peer_poll_retries_total":                        "peer,reason",
		"grid_peer_poll_slow_total":                           "peer",
		"grid_peer_polls_in_flight":                           "",
		"grid_peer_response_bytes_total":                      "peer",
		"grid_collection_up":                                  "peer",
		"grid_peer_last_success_timestamp_seconds":            "peer",
		"grid_peer_signals_refused_total":                     "peer,reason",
		"grid_signals_connections_shed_total":                 "limit",
		"grid_signals_relay_truncated_total":                  "cut,store",
		"grid_site_identity_expiry_timestamp_seconds":         "",
	}
	gatewaySeries = map[string]string{
		"grid_route_decisions_total":                  "cluster,reason,site",
		"grid_route_selections_total":                 "path",
		"grid_route_site_rho":                         "cluster,site",
		"grid_route_site_weight":                      "cluster,site",
		"grid_route_site_ceiling":                     "cluster,site",
		"grid_route_site_score":                       "cluster,site",
		"grid_route_shedding":                         "model",
		"grid_route_affinity_total":                   "outcome",
		"grid_route_prefix_affinity_total":            "outcome",
		"grid_signals_poll_total":                     "result",
		"grid_signals_last_success_timestamp_seconds": "",
		"grid_signals_response_bytes":                 "",
		"grid_signals_ingest_dropped_total":           "reason",
		"grid_signals_feedback_failures_total":        "reason",
		"grid_site_identity_expiry_timestamp_seconds": "",
	}
	// The gateway's help texts the reference gives word for word.
	gatewayHelp = map[string]string{
		"grid_route_site_rho":     "Saturation the gateway last read for the site, in-flight over its ceiling. NaN when unmeasured.",
		"grid_route_site_weight":  "Capacity the draw weights the site by. NaN when unmeasured.",
		"grid_route_site_ceiling": "Ceiling the gateway has learned for the site. NaN when unmeasured.",
		"grid_route_site_score":   "Score the site ranks by in the current snapshot. NaN when excluded or demoted.",
		"grid_route_shedding":     "1 while the gateway sheds this model, 0 otherwise.",
	}
)

// TestReferenceSeriesNames: every series of docs/protocol.md §5 that Grid exports
// is registered under the reference's name with the reference's labels,
// whether or not it has a sample yet (DESIGN: an external contract).
func TestReferenceSeriesNames(t *testing.T) {
	g := startGrid(t, gridSpec{slots: map[string]int{"east": 1, "west": 1}})
	check := func(component string, reg *prometheus.Registry, want, help map[string]string) {
		got := described(reg)
		for name, labels := range want {
			d, ok := got[name]
			if !ok {
				t.Errorf("%s does not register %s", component, name)
				continue
			}
			if d.labels != labels {
				t.Errorf("%s: %s{%s}, want {%s}", component, name, d.labels, labels)
			}
			if h, ok := help[name]; ok && d.help != h {
				t.Errorf("%s: %s help %q, want %q", component, name, d.help, h)
			}
		}
	}
	check("operator", g["east"].op.Registry(), operatorSeries, nil)
	check("gateway", g["east"].gw.Registry(), gatewaySeries, gatewayHelp)
}

type description struct{ help, labels string }

var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]*)", help: "((?:[^"\\]|\\.)*)", .*variableLabels: \{([^}]*)\}\}$`)

// described lists what reg registers: name, help, and label names sorted
// and joined by commas.
func described(reg *prometheus.Registry) map[string]description {
	ch := make(chan *prometheus.Desc, 256)
	go func() { reg.Describe(ch); close(ch) }()
	out := map[string]description{}
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		labels := strings.Split(m[3], ",")
		slices.Sort(labels)
		out[m[1]] = description{help: m[2], labels: strings.Trim(strings.Join(labels, ","), ",")}
	}
	return out
}
