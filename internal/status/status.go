// Package status renders what a Grid daemon currently believes, read from
// its Prometheus /metrics page, as a table for people: per site and provider
// the readiness, endpoints and in-flight load; per peer the poll health and
// whether its signal ages are being rejected.
package status

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/signals/expo"
)

type providerRow struct {
	site, provider         string
	ready, endpoints, load *float64
	reason                 string
	admission              string
}

// routeRow is what a gateway believes of one site's provider.
type routeRow struct {
	site, cluster               string
	rho, ceiling, weight, score *float64
	picks                       float64
}

type peerRow struct {
	peer                    string
	up, lastSuccess, agesRj *float64
}

// Report is a parsed view of one /metrics page.
type Report struct {
	providers map[[2]string]*providerRow
	peers     map[string]*peerRow
	// gatewayAges is GatewayAgesRejected, when the page carries it.
	gatewayAges *float64
	routes      map[[2]string]*routeRow
	shedding    []string
}

var wanted = expo.NewNameSet(signals.Ready, signals.ReadyEndpoints, signals.InFlight,
	"grid_provider_readiness", "grid_collection_up", "grid_peer_last_success_timestamp_seconds", "grid_peer_ages_rejected",
	"grid_gateway_ages_rejected", "grid_route_site_rho", "grid_route_site_ceiling", "grid_route_site_weight",
	"grid_route_site_score", "grid_route_decisions_total", "grid_route_shedding", "grid_provider_admission")

// Parse reads a /metrics page.
func Parse(body []byte) (*Report, error) {
	r := &Report{providers: map[[2]string]*providerRow{}, peers: map[string]*peerRow{}, routes: map[[2]string]*routeRow{}}
	_, err := expo.Scan(body, wanted.Has, func(s *expo.Sample) {
		label := func(n string) string { v, _ := s.Label(n); return string(v) }
		v := s.Value
		switch name := string(s.Name); name {
		case "grid_gateway_ages_rejected":
			r.gatewayAges = &v
		case "grid_route_shedding":
			if v == 1 {
				r.shedding = append(r.shedding, label("model"))
			}
		case "grid_route_site_rho", "grid_route_site_ceiling", "grid_route_site_weight", "grid_route_site_score", "grid_route_decisions_total":
			site, cluster := label("site"), label("cluster")
			if site == "" {
				return // refusals
			}
			k := [2]string{site, cluster}
			rr := r.routes[k]
			if rr == nil {
				rr = &routeRow{site: site, cluster: cluster}
				r.routes[k] = rr
			}
			switch name {
			case "grid_route_site_rho":
				rr.rho = &v
			case "grid_route_site_ceiling":
				rr.ceiling = &v
			case "grid_route_site_weight":
				rr.weight = &v
			case "grid_route_site_score":
				rr.score = &v
			default:
				rr.picks += v
			}
		case "grid_collection_up", "grid_peer_last_success_timestamp_seconds", "grid_peer_ages_rejected":
			p := r.peer(label("peer"))
			switch name {
			case "grid_collection_up":
				p.up = &v
			case "grid_peer_last_success_timestamp_seconds":
				p.lastSuccess = &v
			default:
				p.agesRj = &v
			}
		case "grid_provider_readiness":
			r.provider(label(signals.LabelSite), label(signals.LabelProvider)).reason = label("reason")
		case "grid_provider_admission":
			r.provider(label(signals.LabelSite), label(signals.LabelProvider)).admission = label(signals.LabelAdmission)
		default:
			pr := r.provider(label(signals.LabelSite), label(signals.LabelProvider))
			switch name {
			case signals.Ready:
				pr.ready = &v
			case signals.ReadyEndpoints:
				pr.endpoints = &v
			case signals.InFlight:
				pr.load = &v
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// inKeyOrder lists a table's rows by their {site, name} key: by site, then
// by provider or cluster.
func inKeyOrder[V any](rows map[[2]string]V) []V {
	keys := slices.SortedFunc(maps.Keys(rows), func(a, b [2]string) int {
		return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
	})
	out := make([]V, len(keys))
	for i, k := range keys {
		out[i] = rows[k]
	}
	return out
}

func (r *Report) provider(site, name string) *providerRow {
	k := [2]string{site, name}
	if p := r.providers[k]; p != nil {
		return p
	}
	p := &providerRow{site: site, provider: name}
	r.providers[k] = p
	return p
}

func (r *Report) peer(name string) *peerRow {
	if p := r.peers[name]; p != nil {
		return p
	}
	p := &peerRow{peer: name}
	r.peers[name] = p
	return p
}

// Write prints the report as aligned tables that fit 80 columns.
func (r *Report) Write(w io.Writer, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(r.routes) > 0 {
		fmt.Fprintln(tw, "ROUTE\tPROVIDER\tSTATE\tRHO\tCEILING\tWEIGHT\tQUEUE\tPICKS")
		for _, rr := range inKeyOrder(r.routes) {
			state, queue := "-", num(rr.score) // num reads NaN as "-"
			if rr.score != nil {
				switch v := *rr.score; {
				case math.IsNaN(v):
					state = "excluded"
				case math.IsInf(v, 1):
					state, queue = "routed", "-" // the route reports no queue
				default:
					state = "routed"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\n", rr.site, rr.cluster, state, num2(rr.rho), num(rr.ceiling), num(rr.weight), queue, rr.picks)
		}
		fmt.Fprintln(tw, "(PICKS: requests this gateway sent to the route since it started,")
		fmt.Fprintln(tw, " those that came from peer gateways over the hop included)")
		if len(r.shedding) > 0 {
			slices.Sort(r.shedding)
			fmt.Fprintf(tw, "\nSHEDDING\t%s\n", strings.Join(r.shedding, ", "))
		}
		if len(r.providers) == 0 && len(r.peers) == 0 {
			return tw.Flush()
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(tw, "SITE\tPROVIDER\tREADY\tADMITS\tENDPOINTS\tIN-FLIGHT\tVERDICT")
	for _, p := range inKeyOrder(r.providers) {
		ready := "-"
		if p.ready != nil {
			ready = map[bool]string{true: "yes", false: "no"}[*p.ready == 1]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(p.site), p.provider, ready, admits(p.admission), num(p.endpoints), num(p.load), dash(p.reason))
	}
	if len(r.peers) > 0 {
		fmt.Fprintln(tw, "\nPEER\tPOLL\tLAST OK\tAGES")
		for _, n := range slices.Sorted(maps.Keys(r.peers)) {
			p := r.peers[n]
			up := "-"
			if p.up != nil {
				up = map[bool]string{true: "up", false: "down"}[*p.up == 1]
			}
			last := "never"
			if p.lastSuccess != nil {
				last = now.Sub(time.UnixMilli(int64(*p.lastSuccess*1000))).Round(time.Second).String() + " ago"
			}
			ages := "accepted"
			if p.agesRj != nil && *p.agesRj == 1 {
				ages = "REJECTED (PeerAgesRejected: check its clock)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n, up, last, ages)
		}
	}
	if r.gatewayAges != nil {
		state := "accepted"
		if *r.gatewayAges == 1 {
			state = "REJECTED (GatewayAgesRejected: the gateway drops rows for skew)"
		}
		fmt.Fprintf(tw, "\nGATEWAY AGES\t%s\n", state)
	}
	return tw.Flush()
}

func num(v *float64) string {
	if v == nil || math.IsNaN(*v) {
		return "-"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", *v), ".0")
}

func num2(v *float64) string {
	if v == nil || math.IsNaN(*v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// admits names a provider's admission in a column: all (new and existing
// requests), existing (bound sessions only: draining), none; - unknown.
func admits(a string) string {
	switch signals.Admission(a) {
	case signals.AdmitNewAndExisting:
		return "all"
	case signals.AdmitExistingOnly:
		return "existing"
	case signals.AdmitNone:
		return "none"
	}
	return dash(a)
}
