package backend

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/grid-inference/grid/internal/latency"
	"github.com/grid-inference/grid/internal/readiness"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/signals/expo"
)

// The EPP series a scrape reads, in the order of their indexes below.
var eppNames = expo.NewNameSet(
	signals.EPPReadyEndpoints, signals.LegacyReadyPods, // 0, 1
	signals.EPPAverageRunning, signals.LegacyAverageRunning, // 2, 3
	signals.EPPAverageQueue, signals.LegacyAverageQueue, // 4, 5
	signals.EPPAverageKV, signals.LegacyAverageKV, // 6, 7
	signals.EPPStdDevKV,                                    // 8
	signals.EPPFlowControlQueue,                            // 9
	signals.EPPPerEndpointQueue, signals.LegacyPerPodQueue, // 10, 11
	"llm_d_epp_inflight_requests",                    // 12
	"llm_d_epp_request_ttft_seconds_bucket",          // 13
	"llm_d_epp_request_ttft_seconds_sum",             // 14
	"llm_d_epp_request_ttft_seconds_count",           // 15
	"llm_d_epp_request_streaming_tpot_seconds_sum",   // 16
	"llm_d_epp_request_streaming_tpot_seconds_count", // 17
	"llm_d_epp_request_input_tokens_sum",             // 18
	"llm_d_epp_request_input_tokens_count",           // 19
	"llm_d_epp_request_total",                        // 20
	"llm_d_epp_request_error_total",                  // 21
	"llm_d_epp_inflight_tokens",                      // 22
)

const (
	iReady, iReadyLegacy              = 0, 1
	iRunning, iRunningLegacy          = 2, 3
	iQueue, iQueueLegacy              = 4, 5
	iKV, iKVLegacy                    = 6, 7
	iStdDevKV                         = 8
	iFlow                             = 9
	iPerEndpoint, iPerPod             = 10, 11
	iInflight                         = 12
	iTTFTBucket, iTTFTSum, iTTFTCount = 13, 14, 15
	iTPOTSum, iTPOTCount              = 16, 17
	iInputSum, iInputCount            = 18, 19
	iRequests, iErrors                = 20, 21
	iInflightTokens                   = 22
	nEPPNames                         = 23
)

// poolGauge gathers one pool gauge: the max over series of the pool.
type poolGauge struct {
	value float64
	found bool
}

func (g *poolGauge) add(v float64) {
	if !g.found || v > g.value {
		g.value = v
	}
	g.found = true
}

// first returns the first present gauge of a current/legacy pair.
func first(gs ...*poolGauge) *poolGauge {
	for _, g := range gs {
		if g.found {
			return g
		}
	}
	return nil
}

// ParseEPP reads an EPP exposition for the pool (empty pool: every pool).
func ParseEPP(body []byte, pool string) (*Reading, error) {
	p := newEPPPage(pool)
	_, err := expo.Scan(body, eppNames.Has, func(s *expo.Sample) {
		// Counts and gauges of load are finite and never negative; a line
		// that says otherwise is dropped rather than published.
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) || s.Value < 0 {
			return
		}
		switch i := eppNames.Index(s.Name); i {
		case iReady, iReadyLegacy, iRunning, iRunningLegacy, iQueue, iQueueLegacy, iKV, iKVLegacy, iStdDevKV, iPerEndpoint, iPerPod:
			p.poolSample(s, i)
		case iFlow:
			p.flowSample(s)
		case iInflight:
			p.inflightSample(s, p.inflight)
		case iInflightTokens:
			p.inflightSample(s, p.inflightTokens)
		default:
			p.latencySample(s, i)
		}
	})
	if err != nil {
		return nil, &Error{ClassParse, err}
	}
	return p.reading(), nil
}

// eppPage accumulates what one scan of an EPP exposition says about pool.
type eppPage struct {
	pool       string
	gauges     [nEPPNames]poolGauge
	pools      map[string]bool // every pool that reports readiness
	namespaces map[string]bool // every namespace an in-flight producer reports
	inflight   map[string]map[[2]string]float64
	// inflightTokens is the same as inflight for the producers' token
	// counts (uncached prompt tokens before their first byte).
	inflightTokens map[string]map[[2]string]float64
	flow           float64
	rows           []signals.Row
	units          bool // per-endpoint queues seen: the pool's units report
	latency        latency.Snapshot
	haveLat        bool
	// counters points each latency counter's index at the field of latency
	// it sums into.
	counters [nEPPNames]*float64
}

func newEPPPage(pool string) *eppPage {
	p := &eppPage{pool: pool, pools: map[string]bool{}, namespaces: map[string]bool{}, inflight: map[string]map[[2]string]float64{},
		inflightTokens: map[string]map[[2]string]float64{}}
	l := &p.latency
	p.counters[iTTFTSum], p.counters[iTTFTCount] = &l.TTFTSum, &l.TTFTCount
	p.counters[iTPOTSum], p.counters[iTPOTCount] = &l.TPOTSum, &l.TPOTCount
	p.counters[iInputSum], p.counters[iInputCount] = &l.InputSum, &l.InputCount
	p.counters[iRequests], p.counters[iErrors] = &l.Requests, &l.Errors
	return p
}

// poolSample takes a pool gauge (label name) of the pool, relayed as a row.
func (p *eppPage) poolSample(s *expo.Sample, i int) {
	name, _ := s.Label("name")
	if i == iReady || i == iReadyLegacy {
		p.pools[string(name)] = true
	}
	if p.pool != "" && string(name) != p.pool {
		return
	}
	p.gauges[i].add(s.Value)
	if i == iPerEndpoint || i == iPerPod {
		p.units = true
	}
	p.rows = append(p.rows, rowOf(s, i))
}

// flowSample sums the flow-control queue of the pool (label inference_pool)
// over its fairness and priority partitions.
func (p *eppPage) flowSample(s *expo.Sample) {
	if pl, ok := s.Label("inference_pool"); p.pool != "" && (!ok || string(pl) != p.pool) {
		return
	}
	p.flow += s.Value
	p.gauges[iFlow].add(s.Value)
}

// inflightSample records into byProducer one producer's in-flight count
// (of requests, or of tokens) for one endpoint, summed over its fairness
// ids.
func (p *eppPage) inflightSample(s *expo.Sample, byProducer map[string]map[[2]string]float64) {
	producer, _ := s.Label("producer_name")
	ns, _ := s.Label("namespace")
	ep, _ := s.Label("endpoint_name")
	p.namespaces[string(ns)] = true
	m := byProducer[string(producer)]
	if m == nil {
		m = map[[2]string]float64{}
		byProducer[string(producer)] = m
	}
	m[[2]string{string(ns), string(ep)}] += s.Value
}

// latencySample adds a latency histogram bucket or counter; time to first
// token counts streaming requests only.
func (p *eppPage) latencySample(s *expo.Sample, i int) {
	if i == iTTFTBucket || i == iTTFTSum || i == iTTFTCount {
		if st, _ := s.Label("streaming"); string(st) != "true" {
			return
		}
	}
	if i == iTTFTBucket {
		le, _ := s.Label("le")
		bound, err := parseBound(le)
		if err != nil {
			return
		}
		p.latency.AddTTFTBucket(bound, s.Value)
	} else {
		*p.counters[i] += s.Value
	}
	p.haveLat = true
}

// reading concludes the page: readiness (current name, else legacy), load,
// the relayed rows and latency.
func (p *eppPage) reading() *Reading {
	r := &Reading{Source: SourceMetrics, Result: ResultSuccess, UnitsReporting: p.units}
	r.MultiPool = len(p.pools) > 1 || len(p.namespaces) > 1
	if g := first(&p.gauges[iReady], &p.gauges[iReadyLegacy]); g != nil {
		r.Ready = readiness.Known(g.value)
	} else if p.pool != "" && len(p.pools) > 0 {
		// The EPP reports the readiness of other pools and not of this
		// one: it does not serve poolName (a typo, or a pool removed), so
		// the pool has no endpoint here, rather than readiness unknown.
		// Seen on the real EPP, which reports every pool it serves.
		r.Ready = readiness.Known(0)
		r.Result = ResultNoSeries
		r.Missing = fmt.Sprintf("the EPP reports the ready endpoints of pool %s, not of poolName %s", strings.Join(slices.Sorted(maps.Keys(p.pools)), ", "), p.pool)
	} else {
		r.Result = ResultNoSeries
		r.Missing = "metrics reachable, but no " + signals.EPPReadyEndpoints + " or " + signals.LegacyReadyPods + " series"
		if p.pool != "" {
			r.Missing += " for poolName " + p.pool
		}
	}
	if g := first(&p.gauges[iRunning], &p.gauges[iRunningLegacy]); g != nil {
		r.Load.AverageRunning = &g.value
	}
	if g := first(&p.gauges[iQueue], &p.gauges[iQueueLegacy]); g != nil {
		r.Load.AverageQueue = &g.value
	}
	r.Load.FlowControl = p.flow
	if !r.MultiPool && len(p.inflight) > 0 {
		count := eppInflight(p.inflight)
		r.Load.EPPCount = &count
	}
	if !r.MultiPool && len(p.inflightTokens) > 0 {
		tokens := eppInflight(p.inflightTokens)
		r.Load.PrefillTokens = &tokens
	}
	r.Rows = p.rows
	if p.gauges[iFlow].found {
		// One row per pool, the sum over fairness and priority partitions: the
		// relay stays bounded however many flows a client invents.
		row := signals.Row{Name: signals.EPPFlowControlQueue, Value: p.flow}
		if p.pool != "" {
			row.Labels = []signals.Label{{Name: "inference_pool", Value: p.pool}}
		}
		r.Rows = append(r.Rows, row)
	}
	if p.haveLat {
		r.Latency = &p.latency
	}
	return r
}

// eppInflight sums, per endpoint, the largest count any producer reports
// (of requests, or of tokens).
func eppInflight(byProducer map[string]map[[2]string]float64) float64 {
	perEndpoint := map[[2]string]float64{}
	for _, m := range byProducer {
		for ep, v := range m {
			if v > perEndpoint[ep] {
				perEndpoint[ep] = v
			}
		}
	}
	var sum float64
	for _, v := range perEndpoint {
		sum += v
	}
	return sum
}

// contractName maps a name index to the contract name it is published under.
var contractName = map[int]string{
	iReady: signals.EPPReadyEndpoints, iReadyLegacy: signals.LegacyReadyPods,
	iRunning: signals.EPPAverageRunning, iRunningLegacy: signals.LegacyAverageRunning,
	iQueue: signals.EPPAverageQueue, iQueueLegacy: signals.LegacyAverageQueue,
	iKV: signals.EPPAverageKV, iKVLegacy: signals.LegacyAverageKV,
	iStdDevKV:    signals.EPPStdDevKV,
	iPerEndpoint: signals.EPPPerEndpointQueue, iPerPod: signals.LegacyPerPodQueue,
}

// rowOf copies a kept sample into a row, labels as scraped: the operator
// attributes the row (operator.attribute moves a scraped grid_site or
// grid_provider to exported_*).
func rowOf(s *expo.Sample, i int) signals.Row {
	row := signals.Row{Name: contractName[i], Value: s.Value}
	s.EachLabel(func(n, v []byte) bool {
		row.Labels = append(row.Labels, signals.Label{Name: string(n), Value: string(v)})
		return true
	})
	return row
}

func parseBound(le []byte) (float64, error) {
	s := strings.TrimSpace(string(le))
	if s == "+Inf" || s == "Inf" {
		return math.Inf(1), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("le %q: %w", s, err)
	}
	return f, nil
}
