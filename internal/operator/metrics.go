package operator

import (
	"log"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/grid-inference/grid/internal/backend"
	"github.com/grid-inference/grid/internal/connlimit"
	"github.com/grid-inference/grid/internal/signals"
)

// metrics is the operator's Prometheus registry (docs/protocol.md §5).
type metrics struct {
	reg         *prometheus.Registry
	scrapes     scrapeCounter
	lastSuccess *prometheus.GaugeVec
	// phaseWidth is how narrowly each refreshing provider's
	// recomputation instants are known (refreshPhase).
	phaseWidth  *prometheus.GaugeVec
	reloads     *prometheus.CounterVec
	metricsShed prometheus.Counter
	// reprobes counts /v1/loads absences forgotten, by reason: the engine
	// was replaced (recovered) or the absence grew old (expired).
	reprobes *prometheus.CounterVec
	peers    *peerMetrics
}

type scrapeCounter struct{ *prometheus.CounterVec }

// initProvider creates every result series of a provider at zero, so rates
// work from the first scrape.
func (c scrapeCounter) initProvider(name string) {
	for _, r := range backend.Results {
		c.WithLabelValues(name, r)
	}
}

// Reprobe reasons.
const (
	reprobeRecovered = "recovered"
	reprobeExpired   = "expired"
)

func (c scrapeCounter) count(name, result string) { c.WithLabelValues(name, result).Inc() }

func newMetrics(o *Operator) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		scrapes: scrapeCounter{prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_provider_scrape_total",
			Help: "Provider scrapes by result: success, no_series, or a failure class.",
		}, []string{signals.LabelProvider, "result"})},
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grid_provider_last_scrape_success_timestamp_seconds",
			Help: "Unix time of the provider's last scrape that carried its ready series.",
		}, []string{signals.LabelProvider}),
		phaseWidth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grid_provider_refresh_phase_width_seconds",
			Help: "How narrowly the instants at which a provider with metrics.refreshInterval recomputes its gauges are known: the interval itself until learnt.",
		}, []string{signals.LabelProvider}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_config_reload_total",
			Help: "Configuration reloads by result: applied or rejected.",
		}, []string{"result"}),
		reprobes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_provider_loads_reprobe_total",
			Help: "Remembered /v1/loads absences forgotten so the engine is asked again: recovered (a failed scrape, then a good one: the engine may have been replaced) or expired (10 minutes old).",
		}, []string{signals.LabelProvider, "reason"}),
		metricsShed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grid_metrics_connections_shed_total",
			Help: "Connections to the plain operations listener closed at accept for its cap.",
		}),
	}
	m.reloads.WithLabelValues("applied")
	m.reloads.WithLabelValues("rejected")
	m.peers = newPeerMetrics(m.reg)
	m.reg.MustRegister(m.scrapes, m.lastSuccess, m.phaseWidth, m.reloads, m.metricsShed, m.reprobes, storeCollector{o},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) forgetProvider(name string) {
	m.scrapes.DeletePartialMatch(prometheus.Labels{signals.LabelProvider: name})
	m.lastSuccess.DeleteLabelValues(name)
	m.phaseWidth.DeleteLabelValues(name)
}

// CountReload records a configuration reload's result.
func (o *Operator) CountReload(applied bool) {
	result := "rejected"
	if applied {
		result = "applied"
	}
	o.m.reloads.WithLabelValues(result).Inc()
}

// Registry is the operator's Prometheus registry.
func (o *Operator) Registry() *prometheus.Registry { return o.m.reg }

var (
	providerDescs = func() map[string]*prometheus.Desc {
		help := map[string]string{
			signals.Ready:          "1 when the provider can serve, 0 when its readiness verdict excludes it.",
			signals.ReadyEndpoints: "Ready endpoints in the provider's last good scrape.",
			signals.InFlight:       "Requests the provider holds: the larger of the EPP's per-endpoint count and (average running + queued) x ready endpoints, plus flow control.",
			signals.TTFTP50:        "Median time to first token of streaming requests over the last 30s.",
			signals.TTFTP90:        "90th percentile time to first token of streaming requests over the last 30s.",
			signals.TPOT:           "Mean time per output token of streaming requests over the last 30s.",
			signals.ErrorRatio:     "Failed requests over all requests in the last 30s.",
			signals.MaxRunning:     "The most requests one ready unit of the provider runs at once, as configured (maxRunning) or as its engine declares it.",
		}
		out := map[string]*prometheus.Desc{}
		for _, n := range append(slices.Clone(signals.ProviderSeries), signals.MaxRunning) {
			out[n] = prometheus.NewDesc(n, help[n], []string{signals.LabelSite, signals.LabelProvider}, nil)
		}
		return out
	}()
	admissionDesc = prometheus.NewDesc("grid_provider_admission",
		"Which requests the provider takes, from its info row: 1 on the series of its admission (new_and_existing, existing_only, none).",
		[]string{signals.LabelSite, signals.LabelProvider, signals.LabelAdmission}, nil)
	verdictDesc = prometheus.NewDesc("grid_provider_readiness",
		"The provider's current readiness verdict: 1 on the series of its reason and status.",
		[]string{signals.LabelSite, signals.LabelProvider, "reason", "status"}, nil)
	engineDescs = map[string]*prometheus.Desc{
		"waiting_uncached_tokens": prometheus.NewDesc("grid_provider_engine_waiting_uncached_tokens", "Prompt tokens waiting to be prefilled, from the engine's /v1/loads.", []string{signals.LabelSite, signals.LabelProvider}, nil),
		"token_usage":             prometheus.NewDesc("grid_provider_engine_token_usage", "KV token-pool usage of the engine, 0 to 1.", []string{signals.LabelSite, signals.LabelProvider}, nil),
		"gen_throughput":          prometheus.NewDesc("grid_provider_engine_gen_throughput_tokens_per_second", "Generation throughput of the engine.", []string{signals.LabelSite, signals.LabelProvider}, nil),
		"prefill_queue":           prometheus.NewDesc("grid_provider_engine_prefill_queue_requests", "Requests in the engine's disaggregated prefill queues.", []string{signals.LabelSite, signals.LabelProvider}, nil),
		"decode_queue":            prometheus.NewDesc("grid_provider_engine_decode_queue_requests", "Requests in the engine's disaggregated decode queues.", []string{signals.LabelSite, signals.LabelProvider}, nil),
	}
)

// storeCollector exports the provider conclusions held in the store: a
// series the operator does not hold is absent, not 0.
type storeCollector struct{ o *Operator }

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range providerDescs {
		ch <- d
	}
	ch <- verdictDesc
	ch <- admissionDesc
	for _, d := range engineDescs {
		ch <- d
	}
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	o := c.o
	now := o.clk.Now()
	seen := map[[3]string]bool{}
	entries := o.site.Current(now)
	entries = append(entries, o.peerStore.Current(now)...)
	for _, e := range entries {
		for i := range e.Rows {
			row := &e.Rows[i]
			site, _ := row.Label(signals.LabelSite)
			prov, _ := row.Label(signals.LabelProvider)
			if row.Name == signals.Info && !seen[[3]string{row.Name, site, prov}] {
				seen[[3]string{row.Name, site, prov}] = true
				a, _ := row.Label(signals.LabelAdmission)
				if admission, known := signals.ParseAdmission(a); known {
					a = string(admission)
				}
				ch <- prometheus.MustNewConstMetric(admissionDesc, prometheus.GaugeValue, 1, site, prov, a)
				continue
			}
			d, ok := providerDescs[row.Name]
			if !ok {
				continue
			}
			key := [3]string{row.Name, site, prov}
			if seen[key] { // the first holder wins
				continue
			}
			seen[key] = true
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, row.Value, site, prov)
		}
	}
	site := o.cfg.Load().Site
	o.providers.Range(func(k, v any) bool {
		p := v.(*provider)
		p.mu.Lock()
		verdict, engine, scraped := p.verdict, p.engine, p.scraped
		p.mu.Unlock()
		name := k.(string)
		if scraped {
			ch <- prometheus.MustNewConstMetric(verdictDesc, prometheus.GaugeValue, 1, site, name, string(verdict.Reason), string(verdict.Status))
		}
		if engine != nil {
			// Only what the engine's source gave: an unknown reading is
			// absent, never a 0 a dashboard would believe.
			for _, x := range []struct {
				field backend.EngineFields
				key   string
				v     float64
			}{
				{backend.FieldWaitingUncached, "waiting_uncached_tokens", engine.WaitingUncachedTokens},
				{backend.FieldTokenUsage, "token_usage", engine.TokenUsage},
				{backend.FieldGenThroughput, "gen_throughput", engine.GenThroughput},
				{backend.FieldDisaggregation, "prefill_queue", engine.PrefillQueue},
				{backend.FieldDisaggregation, "decode_queue", engine.DecodeQueue},
			} {
				if engine.Known&x.field != 0 {
					ch <- prometheus.MustNewConstMetric(engineDescs[x.key], prometheus.GaugeValue, x.v, site, name)
				}
			}
		}
		return true
	})
}

// MetricsConns bounds the plain operations listener's open connections: a
// Prometheus server holds one; no client needs hundreds.
const MetricsConns = 256

// MetricsServer returns the server of the plain operations listener and ln
// bounded to MetricsConns, with headers bounded in size and time.
func (o *Operator) MetricsServer(ln net.Listener, errLog *log.Logger) (*http.Server, net.Listener) {
	srv := &http.Server{Handler: o.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 16 << 10, ErrorLog: errLog}
	shed := o.m.metricsShed
	return srv, connlimit.New(ln, connlimit.Limits{Total: MetricsConns}, func(string) { shed.Inc() })
}

// Handler serves the plain operations listener: /metrics, /healthz, /readyz.
func (o *Operator) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready, why := o.Ready(); !ready {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}
