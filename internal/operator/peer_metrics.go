package operator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grid-inference/grid/internal/signals"
)

// peerMetrics are the cross-site series of docs/protocol.md §5.
type peerMetrics struct {
	polls        *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	retries      *prometheus.CounterVec
	slow         *prometheus.CounterVec
	inFlight     prometheus.Gauge
	bytes        *prometheus.CounterVec
	up           *prometheus.GaugeVec
	lastSuccess  *prometheus.GaugeVec
	refused      *prometheus.CounterVec
	agesRejected *prometheus.GaugeVec
	shed         *prometheus.CounterVec
	accepted     prometheus.Counter
	truncated    *prometheus.CounterVec
}

func newPeerMetrics(reg *prometheus.Registry) *peerMetrics {
	m := &peerMetrics{
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_peer_poll_total", Help: "Peer polls by outcome."}, []string{"peer", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "grid_peer_poll_duration_seconds", Help: "Time one peer's poll took, retries included.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"peer"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_peer_poll_retries_total", Help: "Peer poll retries by the outcome that prompted them."}, []string{"peer", "reason"}),
		slow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_peer_poll_slow_total", Help: "Peer polls that took peerPoll.slow or longer, retries included."}, []string{"peer"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "grid_peer_polls_in_flight", Help: "Peer polls running now."}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_peer_response_bytes_total", Help: "Bytes of successful peer answers."}, []string{"peer"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grid_collection_up", Help: "1 if the peer's latest poll succeeded, 0 if it failed."}, []string{"peer"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grid_peer_last_success_timestamp_seconds", Help: "Unix time of the peer's last successful poll."}, []string{"peer"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_peer_signals_refused_total", Help: "Rows of peer answers refused, by reason."}, []string{"peer", "reason"}),
		agesRejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "grid_peer_ages_rejected", Help: "1 while the peer's latest answer carried rows refused for implausible age (PeerAgesRejected)."}, []string{"peer"}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grid_signals_connections_accepted_total", Help: "Connections the signals listener took in for a TLS handshake."}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_signals_connections_shed_total", Help: "Signals listener connections shed, by the limit that shed them."}, []string{"limit"}),
		truncated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grid_signals_relay_truncated_total", Help: "Targets dropped from a signals answer to keep it bounded, by store and cut."}, []string{"store", "cut"}),
	}
	for _, limit := range []string{"total", "source", "peer"} {
		m.shed.WithLabelValues(limit)
	}
	for _, store := range []string{"site", "peers"} {
		for _, cut := range []string{"target", "lines"} {
			m.truncated.WithLabelValues(store, cut)
		}
	}
	reg.MustRegister(m.polls, m.duration, m.retries, m.slow, m.inFlight, m.bytes, m.up, m.lastSuccess, m.refused, m.agesRejected, m.shed, m.accepted, m.truncated)
	return m
}

func (m *peerMetrics) initPeer(site string) {
	for _, o := range Outcomes {
		m.polls.WithLabelValues(site, o)
	}
	for _, r := range signals.Refusals() {
		if r != signals.RefuseStoreCap { // the peer store has no key cap
			m.refused.WithLabelValues(site, r.PeerLabel())
		}
	}
	m.agesRejected.WithLabelValues(site).Set(0)
}

func (m *peerMetrics) forgetPeer(site string) {
	l := prometheus.Labels{"peer": site}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.polls, m.duration, m.retries, m.bytes, m.up, m.lastSuccess, m.refused, m.agesRejected,
	} {
		v.DeletePartialMatch(l)
	}
}
