package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grid-inference/grid/internal/affinity"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/route"
)

// headerBoundProvider, on a request forwarded over the hop, names the
// provider of the receiving site that a session is bound to: the entry
// gateway holds the binding, the receiving one honours it (a provider that
// admits existing sessions only takes the request). It is internal
// (X-Grid-*): stripped from clients, read only from peers.
const headerBoundProvider = "X-Grid-Bound-Provider"

// Outcomes of grid_route_affinity_total and grid_route_prefix_affinity_total.
const (
	affinityBound    = "bound"
	affinityReused   = "reused"
	affinityFailover = "failover"
	affinityExpired  = "expired"
	affinityEvicted  = "evicted"

	prefixPreferred = "preferred"
	prefixYielded   = "yielded"
	prefixExplored  = "explored"
)

var (
	affinityOutcomes = []string{affinityBound, affinityReused, affinityFailover, affinityExpired, affinityEvicted}
	prefixOutcomes   = []string{prefixPreferred, prefixYielded, prefixExplored}
)

// sessionBounds are the table's caps from the configuration.
func sessionBounds(a *config.Affinity) affinity.Bounds {
	return affinity.Bounds{TTLMs: a.TTL.D().Milliseconds(), MaxEntries: a.MaxSessions, MaxBytes: a.MaxBytes}
}

// registerAffinity exports the session table's size.
func (m *metrics) registerAffinity(t *affinity.Table) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "grid_route_affinity_sessions",
			Help: "Sessions the gateway holds bound (affinity.maxSessions caps them)."},
			func() float64 { return float64(t.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "grid_route_affinity_bytes",
			Help: "Bytes the session table takes, keys and entries (affinity.maxBytes caps them)."},
			func() float64 { return float64(t.Bytes()) }))
}

// session is one request's affinity: its key in the session table ("" for
// none) and what the lookup found.
type session struct {
	key string
	// failover: the request had a binding that could not be kept.
	failover bool
}

// sessionKey reads a request's session key from the configured header,
// then the cookie; "" when neither carries one.
func sessionKey(r *http.Request, a *config.Affinity) string {
	if a.Header != "" {
		if v := r.Header.Get(a.Header); v != "" {
			return v
		}
	}
	if a.Cookie != "" {
		if c, err := r.Cookie(a.Cookie); err == nil && c.Value != "" {
			return c.Value
		}
	}
	return ""
}

// prefixHash is FNV-1a over the model and the prompt's head, finished with
// a SplitMix64 mix. It is the same in every process, unlike a seeded hash:
// every gateway replica, and every site's gateway, must map one prefix to
// one site. It allocates nothing.
func prefixHash(model string, head []byte) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(model); i++ {
		h = (h ^ uint64(model[i])) * 1099511628211
	}
	h *= 1099511628211 // a zero byte between model and prompt
	for _, b := range head {
		h = (h ^ uint64(b)) * 1099511628211
	}
	h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9
	h = (h ^ (h >> 27)) * 0x94D049BB133111EB
	return h ^ (h >> 31)
}

// pick chooses a candidate for the request's model: a request of a bound
// session goes to its site while the snapshot keeps it
// (route.Snapshot.Keep); a request with a prompt prefix and no session key
// to the prefix's preferred site (route.Snapshot.Prefer) when prefix
// affinity is on; anything else, and anything affinity cannot place, by
// the normal pick. A hop request keeps
// the binding its entry gateway named (exchange.boundProvider).
func (x *exchange) pick(prompt []byte) (route.Pick, session) {
	g, r, snap, model, turn := x.g, x.r, x.snap, x.model, x.turn
	cfg := g.cfg.Load()
	a := &cfg.Affinity
	now := g.timeline.NowMs()
	normal := func() route.Pick { return snap.PickSized(model, x.cost, turn, now) }
	if snap.Shedding[model] {
		return normal(), session{} // shedding answers every request alike
	}
	if x.peer != nil {
		// The entry gateway holds the binding and chose this site.
		if x.boundProvider != "" {
			if p, v := snap.Keep(model, cfg.Site, x.boundProvider, now, *a.Threshold); v == route.Kept {
				return p, session{}
			}
		}
		return normal(), session{}
	}
	if !a.On() {
		return normal(), session{}
	}
	if key := sessionKey(r, a); key != "" {
		s := session{key: model + "\x00" + key}
		b, found := g.sessions.Lookup(s.key, g.clk.Now().UnixMilli())
		switch found {
		case affinity.Found:
			if p, v := snap.Keep(model, b.Site, b.Provider, now, *a.Threshold); v == route.Kept {
				g.m.affinity.WithLabelValues(affinityReused).Inc()
				return p, s
			}
			s.failover = true
		case affinity.Expired:
			g.m.affinity.WithLabelValues(affinityExpired).Inc()
		}
		return normal(), s
	}
	if a.Prefix.Enabled && len(prompt) > 0 {
		if unitOf(turn) < *a.Prefix.Exploration {
			g.m.prefixAffinity.WithLabelValues(prefixExplored).Inc()
			return normal(), session{}
		}
		if p, ok := snap.Prefer(model, prefixHash(model, prompt[:min(len(prompt), a.Prefix.Bytes)]), now, *a.Threshold); ok {
			g.m.prefixAffinity.WithLabelValues(prefixPreferred).Inc()
			return p, session{}
		}
		g.m.prefixAffinity.WithLabelValues(prefixYielded).Inc()
	}
	return normal(), session{}
}

// bind records where a session's request was served, unless it was served
// where it was bound: a new binding, a failover's new site, or the site a
// bound request was retried on.
func (g *Gateway) bind(s session, pick route.Pick, served affinity.Binding) {
	if s.key == "" || served.Site == "" {
		return
	}
	if c := pick.Candidate; pick.Path == route.PathSession && c.Site == served.Site && c.Provider == served.Provider {
		return
	}
	if s.failover || pick.Path == route.PathSession {
		g.m.affinity.WithLabelValues(affinityFailover).Inc()
	}
	g.m.affinity.WithLabelValues(affinityBound).Inc()
	if n := g.sessions.Bind(s.key, served, g.clk.Now().UnixMilli()); n > 0 {
		g.m.affinity.WithLabelValues(affinityEvicted).Add(float64(n))
	}
}

// unitOf maps a request turn to [0, 1), independent of the draws the pick
// makes from the same turn.
func unitOf(turn uint64) float64 {
	x := turn ^ 0xD6E8FEB86659FD93
	x = (x ^ (x >> 32)) * 0xD6E8FEB86659FD93
	x = (x ^ (x >> 32)) * 0xD6E8FEB86659FD93
	return float64((x^(x>>32))>>11) / (1 << 53)
}
