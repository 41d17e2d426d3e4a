package gateway

import (
	"math"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/grid-inference/grid/internal/connlimit"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/signals"
)

// metrics are the gateway's series (docs/protocol.md §5).
type metrics struct {
	reg               *prometheus.Registry
	decisions         *prometheus.CounterVec
	selections        *prometheus.CounterVec
	rho               *prometheus.GaugeVec
	weight            *prometheus.GaugeVec
	ceiling           *prometheus.GaugeVec
	score             *prometheus.GaugeVec
	shedding          *prometheus.GaugeVec
	polls             *prometheus.CounterVec
	lastSuccess       prometheus.Gauge
	responseBytes     prometheus.Gauge
	dropped           *prometheus.CounterVec
	reloads           *prometheus.CounterVec
	duration          *prometheus.HistogramVec
	retries           prometheus.Counter
	feedbackFailures  *prometheus.CounterVec
	connsShed         *prometheus.CounterVec
	ejections         *prometheus.CounterVec
	upstreamErrors    *prometheus.CounterVec
	streamsEndedEarly *prometheus.CounterVec
	hopRefused        *prometheus.CounterVec
	readingAge        *prometheus.HistogramVec
	bodyBudgetRefused prometheus.Counter
	held              prometheus.Gauge
	holds             *prometheus.CounterVec
	requestTokens     *prometheus.HistogramVec
	affinity          *prometheus.CounterVec
	prefixAffinity    *prometheus.CounterVec
	trust             *prometheus.GaugeVec

	published  map[[2]string]bool
	shedModels map[string]bool
}

func newMetrics() *metrics {
	sc := []string{"site", "cluster"}
	m := &metrics{
		reg:              prometheus.NewRegistry(),
		decisions:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_route_decisions_total", Help: "Routing decisions: routed and fallback per site; refusals with an empty site."}, []string{"site", "cluster", "reason"}),
		selections:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_route_selections_total", Help: "Selections by path: age_aware (the default policy's draw); session and prefix (affinity kept a request on its bound or preferred site); and the reference arms two_choices, between_two, lone, by_capacity (the age-aware policy uses them only while no site is measured)."}, []string{"path"}),
		rho:              prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grid_route_site_rho", Help: "Saturation the gateway last read for the site, in-flight over its ceiling. NaN when unmeasured."}, sc),
		weight:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grid_route_site_weight", Help: "Capacity the draw weights the site by. NaN when unmeasured."}, sc),
		ceiling:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grid_route_site_ceiling", Help: "Ceiling the gateway has learned for the site. NaN when unmeasured."}, sc),
		score:            prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grid_route_site_score", Help: "Score the site ranks by in the current snapshot. NaN when excluded or demoted."}, sc),
		shedding:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grid_route_shedding", Help: "1 while the gateway sheds this model, 0 otherwise."}, []string{"model"}),
		polls:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_signals_poll_total", Help: "Operator polls by result: ok, unreachable, unauthorized, too_large, no_date, encoding, config."}, []string{"result"}),
		lastSuccess:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "grid_signals_last_success_timestamp_seconds", Help: "Unix time of the last successful operator poll."}),
		responseBytes:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "grid_signals_response_bytes", Help: "Size of the last successful relay read, all its pages together."}),
		dropped:          prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_signals_ingest_dropped_total", Help: "Signal rows dropped at ingest, by reason."}, []string{"reason"}),
		reloads:          prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_config_reload_total", Help: "Configuration reloads by result: applied or rejected."}, []string{"result"}),
		duration:         prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "grid_gateway_request_duration_seconds", Help: "Time from a request's arrival to the end of its answer, by outcome.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 16)}, []string{"outcome"}),
		retries:          prometheus.NewCounter(prometheus.CounterOpts{Name: "grid_gateway_upstream_retries_total", Help: "Requests retried on another site after a refused connection, before any byte was sent."}),
		feedbackFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_signals_feedback_failures_total", Help: "Failed deliveries of rejection reports to the operator, by reason: timeout, transport, status, acknowledgment."}, []string{"reason"}),
		connsShed:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_gateway_connections_shed_total", Help: "Connections closed at accept for a limit, by listener (client, hop, metrics) and limit (total, source)."}, []string{"listener", "limit"}),
		ejections:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_gateway_upstream_ejections_total", Help: "Upstreams taken out of routing for a while by passive health: nothing reached the upstream or came back (refused), or five failed answers in a row (5xx)."}, []string{"reason"}),
		requestTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "grid_gateway_request_tokens",
			Help:    "Requests' estimated size in tokens, by part: prompt (token IDs counted, text by its bytes over four) and max_output (the request's own limit, when it sets one).",
			Buckets: prometheus.ExponentialBuckets(16, 2, 14)}, []string{"part"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grid_gateway_requests_held",
			Help: "Client requests held while every site of their model is full (availability.holdWhenFull)."}),
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_gateway_holds_total",
			Help: "Client requests held while every site of their model was full, by how the hold ended: room (a site had room), timeout (held for availability.holdWhenFull, then sent), gone (the client went away), draining."}, []string{"end"}),
		bodyBudgetRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "grid_gateway_body_budget_refused_total",
			Help: "Requests refused (503 body_budget) because the request bodies held in memory reached limits.bodyBytes."}),
		readingAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "grid_gateway_reading_age_seconds",
			Help:    "Age of each site's latest reading at each snapshot rebuild: how stale what the gateway routes on is.",
			Buckets: []float64{.1, .25, .5, 1, 2, 3, 5, 10, 20, 60}}, []string{"site"}),
		hopRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_gateway_hop_refused_total",
			Help: "Requests refused on the hop listener: the caller is not a peer site of this one (not_a_peer), or asked for a model this site does not share with it (model_not_shared)."}, []string{"reason"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_gateway_upstream_errors_total", Help: "Attempts to deliver a request that failed, by site and reason: refused, connect_timeout, tls, not_delivered and connection_lost reached nothing (tried elsewhere); response_timeout, stream and transport failed with the upstream holding the request."}, []string{"site", "reason"}),
		streamsEndedEarly: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_gateway_streams_ended_early_total",
			Help: "Event streams that ended before their [DONE] and were closed with the terminal error event (docs/gateway.md), by site and reason: upstream_cut, upstream_ended."}, []string{"site", "reason"}),
		published:  map[[2]string]bool{},
		shedModels: map[string]bool{},
	}
	for _, r := range []string{"ok", "unreachable", "unauthorized", "too_large", "no_date", "encoding", "config"} {
		m.polls.WithLabelValues(r)
	}
	for _, r := range signals.Refusals() {
		m.dropped.WithLabelValues(r.IngestLabel())
	}
	for _, r := range []string{"applied", "rejected"} {
		m.reloads.WithLabelValues(r)
	}
	for _, r := range []string{"timeout", "transport", "status", "acknowledgment"} {
		m.feedbackFailures.WithLabelValues(r)
	}
	for _, r := range []string{ejectRefused, eject5xx} {
		m.ejections.WithLabelValues(r)
	}
	for _, r := range []string{hopNotAPeer, hopModelNotShared} {
		m.hopRefused.WithLabelValues(r)
	}
	for _, l := range Listeners {
		ln := l.String()
		for _, lim := range []string{connlimit.ShedTotal, connlimit.ShedSource} {
			m.connsShed.WithLabelValues(ln, lim)
		}
	}
	m.affinity = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_route_affinity_total",
		Help: "Session affinity by outcome: bound (a session bound to the site that served it), reused (sent to its bound site), failover (its bound site was gone, closed, unhealthy or above the threshold; rebound), expired (its binding outlived affinity.ttl), evicted (dropped for affinity.maxSessions or maxBytes)."}, []string{"outcome"})
	for _, o := range affinityOutcomes {
		m.affinity.WithLabelValues(o)
	}
	m.prefixAffinity = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_route_prefix_affinity_total",
		Help: "Prefix affinity by outcome: preferred (sent to the prompt prefix's site), yielded (every site in its order was above the threshold or its bounded-load share; the normal pick decided), explored (the exploration share; the normal pick decided)."}, []string{"outcome"})
	for _, o := range prefixOutcomes {
		m.prefixAffinity.WithLabelValues(o)
	}
	m.trust = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "grid_route_site_trust",
		Help: "Share of its claimed capacity a remote site's board is read at for a model: 1 while its answers agree with it, down to 0.05 as they contradict it (docs/routing.md, earned capacity). 1 under the reference policy, which does not earn."}, []string{"site", "model"})
	m.reg.MustRegister(m.affinity, m.prefixAffinity, m.trust)
	m.reg.MustRegister(m.decisions, m.selections, m.rho, m.weight, m.ceiling, m.score, m.shedding, m.polls,
		m.lastSuccess, m.responseBytes, m.dropped, m.reloads, m.duration, m.retries, m.feedbackFailures, m.connsShed, m.ejections, m.upstreamErrors, m.streamsEndedEarly, m.hopRefused, m.bodyBudgetRefused, m.held, m.holds, m.requestTokens, m.readingAge,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// publish sets the per-site gauges from a snapshot: the first candidate of
// each (site, cluster) pair; pairs gone since get NaN.
func (m *metrics) publish(s *route.Snapshot) {
	seen := map[[2]string]bool{}
	for i := range s.Candidates {
		c := &s.Candidates[i]
		k := [2]string{c.Site, c.Provider}
		if seen[k] {
			continue
		}
		seen[k] = true
		for _, f := range upstreamFailures {
			m.upstreamErrors.WithLabelValues(c.Site, string(f)) // 0 from the start
		}
		for _, e := range streamEnds {
			m.streamsEndedEarly.WithLabelValues(c.Site, string(e))
		}
		m.score.WithLabelValues(k[0], k[1]).Set(c.Score)
		if c.Measured {
			m.rho.WithLabelValues(k[0], k[1]).Set(c.Rho)
			m.weight.WithLabelValues(k[0], k[1]).Set(c.Capacity)
			m.ceiling.WithLabelValues(k[0], k[1]).Set(c.Ceiling)
		} else {
			for _, g := range []*prometheus.GaugeVec{m.rho, m.weight, m.ceiling} {
				g.WithLabelValues(k[0], k[1]).Set(math.NaN())
			}
		}
	}
	for k := range m.published {
		if !seen[k] {
			for _, g := range []*prometheus.GaugeVec{m.rho, m.weight, m.ceiling, m.score} {
				g.WithLabelValues(k[0], k[1]).Set(math.NaN())
			}
		}
	}
	m.published = seen
	// Every model the snapshot routes has a shedding series from its first
	// snapshot on, 0 until it sheds; a model no longer routed loses it.
	models := map[string]bool{}
	for _, model := range s.Models() {
		models[model] = true
		v := 0.0
		if s.Shedding[model] {
			v = 1
		}
		m.shedding.WithLabelValues(model).Set(v)
	}
	for model := range m.shedModels {
		if !models[model] {
			m.shedding.DeleteLabelValues(model)
		}
	}
	m.shedModels = models
}

// Registry is the gateway's metric registry, for embedding and tests.
func (g *Gateway) Registry() *prometheus.Registry { return g.m.reg }

// MetricsHandler serves the plain listener: /metrics, /healthz, /readyz.
func (g *Gateway) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ready, why := g.Ready()
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write([]byte(why + "\n"))
	})
	mux.HandleFunc("GET /api/snapshot", g.serveView)
	mux.HandleFunc("GET /api/history", g.serveHistory)
	mux.HandleFunc("GET /ui", serveUI)
	mux.Handle("GET /ui/", http.RedirectHandler("/ui", http.StatusMovedPermanently))
	return mux
}
