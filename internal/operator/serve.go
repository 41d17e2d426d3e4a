package operator

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/signals"
)

// Relay bounds (reference §4.6).
const (
	// MaxLinesPerTarget bounds one target's lines in an answer.
	MaxLinesPerTarget = 4096
	// MaxBodyBytes is what an answer stays under.
	MaxBodyBytes = 768 << 10
)

// refusedBody is the one answer every refused caller gets, whatever the cause.
const refusedBody = "signals: caller is not permitted to read this site\n"

// SignalsHandler serves GET /v1/site/signals to callers on the mTLS
// listener: the site's own gateway (Local) reads the site and peer rows, a
// configured peer site reads this site's rows, anyone else gets 403.
func (o *Operator) SignalsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case ServingPath:
			o.serveServing(w, r)
			return
		case signals.FeedbackPath:
			o.serveFeedback(w, r)
			return
		}
		if r.URL.Path != SignalsPath {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		caller := o.id.Classify(r.TLS)
		local := caller.Class == identity.Local
		if !local && !(caller.Class == identity.Peer && o.isPeer(caller.Site)) {
			forbid(w)
			return
		}
		q := r.URL.Query()
		sel := selection{target: q.Get("target"), collect: append(q["collect[]"], q["collect"]...)}
		// One clock reading for the Date header and every stamp, so that
		// Date minus stamp is an age free of any clock offset.
		now := o.clk.Now()
		var b answer
		o.render(&b, "site", o.site.Current(now), now, sel)
		if local {
			o.render(&b, "peers", o.peerStore.Current(now), now, sel)
		}
		h := w.Header()
		h.Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		h.Set("Date", now.UTC().Format(http.TimeFormat))
		h.Set("Age", strconv.FormatInt(b.ageSeconds(now), 10))
		h.Set("Cache-Control", "no-store")
		w.Write(b.body)
	})
}

func (o *Operator) isPeer(site string) bool {
	return slices.ContainsFunc(o.peers(), func(p config.Peer) bool { return p.Site == site })
}

// selection narrows an answer: target to one provider, collect to names.
// Parameters can only narrow what the caller may read.
type selection struct {
	target  string
	collect []string
}

func (s selection) wants(name string) bool {
	return len(s.collect) == 0 || slices.Contains(s.collect, name)
}

// answer accumulates a signals body.
type answer struct {
	body   []byte
	oldest int64 // the smallest stamp emitted, ms; 0 when nothing was
	full   bool  // the body cap was reached: later targets are dropped
}

func (a *answer) ageSeconds(now time.Time) int64 {
	if a.oldest == 0 {
		return 0
	}
	return max(0, (now.UnixMilli()-a.oldest)/1000)
}

// render appends the contract rows of entries, target by target: a target
// of more than 4096 lines is dropped whole, and once the next target would
// take the body to 768 KiB it and every later one are dropped, so a
// receiver always sees whole batches. Drops are counted.
func (o *Operator) render(a *answer, store string, entries []*Entry, now time.Time, sel selection) {
	var target []byte
	for _, e := range entries {
		if a.full {
			o.m.peers.truncated.WithLabelValues(store, "target").Inc()
			continue
		}
		target = target[:0]
		lines := 0
		stamp := e.StampMs(now)
		for i := range e.Rows {
			row := &e.Rows[i]
			if !signals.IsContract(row.Name) || !sel.wants(row.Name) {
				continue
			}
			if sel.target != "" {
				if p, _ := row.Label(signals.LabelProvider); p != sel.target {
					continue
				}
			}
			target = signals.AppendLine(target, row, stamp)
			lines++
		}
		if lines == 0 {
			continue
		}
		if lines > MaxLinesPerTarget {
			o.m.peers.truncated.WithLabelValues(store, "lines").Inc()
			continue
		}
		if len(a.body)+len(target) >= MaxBodyBytes {
			a.full = true
			o.m.peers.truncated.WithLabelValues(store, "target").Inc()
			continue
		}
		a.body = append(a.body, target...)
		if a.oldest == 0 || stamp < a.oldest {
			a.oldest = stamp
		}
	}
}

// ServingPath is where the operator tells its own gateway what this site
// serves and where requests go.
const ServingPath = "/v1/site/serving"

// Serving is the serving document: this site's providers with the models
// they serve and their upstreams, and each peer site's gateway. Everything
// in it comes from this operator's configuration, never from a peer: a peer
// can describe its own load, not redirect traffic.
type Serving struct {
	Site string `json:"site"`
	// LoadWindowMs is how far back the gateway reads load: long enough to
	// hold the latest reading of every site, peer poll + scrape + poll
	// timeout + peer poll, as the reference's operator computes it.
	LoadWindowMs int64             `json:"loadWindowMs"`
	Providers    []ServingProvider `json:"providers"`
	Peers        []ServingPeer     `json:"peers"`
}

// ServingProvider is one local provider.
type ServingProvider struct {
	Name     string `json:"name"`
	Model    string `json:"model"`
	Upstream string `json:"upstream"`
}

// ServingPeer is where a peer site's gateway takes forwarded requests.
type ServingPeer struct {
	Site    string `json:"site"`
	Gateway string `json:"gateway,omitempty"`
}

// forbid answers a refused caller: one fixed body whatever the cause, and
// the connection is not kept.
func forbid(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusForbidden)
	w.Write([]byte(refusedBody))
}

// localOnly admits one method from this site's own gateway (the Local
// caller) and refuses everything else.
func (o *Operator) localOnly(method string, w http.ResponseWriter, r *http.Request) bool {
	if r.Method != method {
		w.Header().Set("Allow", method)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return false
	}
	if o.id.Classify(r.TLS).Class != identity.Local {
		forbid(w)
		return false
	}
	return true
}

// serveServing answers the Local caller only.
func (o *Operator) serveServing(w http.ResponseWriter, r *http.Request) {
	if !o.localOnly(http.MethodGet, w, r) {
		return
	}
	cfg := o.cfg.Load()
	doc := Serving{Site: cfg.Site, Providers: []ServingProvider{}, Peers: []ServingPeer{},
		LoadWindowMs: (2*cfg.PeerPollInterval.D() + cfg.ScrapeInterval.D() + cfg.PeerPoll.Timeout.D()).Milliseconds()}
	for _, p := range cfg.Providers {
		doc.Providers = append(doc.Providers, ServingProvider{Name: p.Name, Model: p.Model, Upstream: p.Upstream})
	}
	for _, p := range o.peers() {
		doc.Peers = append(doc.Peers, ServingPeer{Site: p.Site, Gateway: p.Gateway})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(doc)
}
