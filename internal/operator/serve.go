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

// refusedBody is the one answer every refused caller gets, whatever the cause.
const refusedBody = "signals: caller is not permitted to read this site\n"

// SignalsHandler serves GET /v1/site/signals to callers on the mTLS
// listener: the site's own gateway (Local) reads the site and peer rows, a
// configured peer site reads this site's rows, anyone else gets 403.
// It holds long polls of up to MaxWait.
func (o *Operator) SignalsHandler() http.Handler { return o.signalsHandler(MaxWait) }

// signalsHandler is SignalsHandler with long polls bounded by maxWait, and
// off when it is zero (Limits.MaxWait).
func (o *Operator) signalsHandler(maxWait time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case signals.ServingPath:
			o.serveServing(w, r)
			return
		case signals.FeedbackPath:
			o.serveFeedback(w, r)
			return
		}
		if r.URL.Path != signals.SignalsPath {
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
		peer, isPeer := o.peer(caller.Site)
		if !local && !(caller.Class == identity.Peer && isPeer) {
			forbid(w)
			return
		}
		q := r.URL.Query()
		sel := selection{target: q.Get("target"), collect: append(q["collect[]"], q["collect"]...)}
		if !local {
			sel.peer, sel.models = &peer, o.providerModels()
		}
		// The long poll: answered when what the caller may read changed
		// after its cursor, or when its wait ends (longpoll.go).
		board, key := o.waits.site, "peer:"+caller.Site
		if local {
			// Gateway replicas share the site's identity: one wait each,
			// told apart by their connection.
			board, key = o.waits.relay, "local:"+r.RemoteAddr
		}
		if ws, ss := q.Get(signals.WaitParam), q.Get(signals.SinceParam); maxWait > 0 && ws != "" && ss != "" && q.Get(signals.AfterParam) == "" {
			wait, err := time.ParseDuration(ws)
			since, serr := strconv.ParseUint(ss, 10, 64)
			if err != nil || serr != nil || wait < 0 {
				http.Error(w, "signals: wait must be a duration and since a cursor from "+signals.CursorHeader, http.StatusBadRequest)
				return
			}
			o.waits.wait(r.Context(), o.clk, board, key, since, o.clk.Now().Add(min(wait, maxWait)))
			if r.Context().Err() != nil {
				return
			}
		}
		// The cursor is read before the rows: a change that lands while
		// they are rendered moves the board past it, so the caller's next
		// wait returns at once and nothing is lost.
		version, _ := board.state()
		// One clock reading for the Date header and every stamp, so that
		// Date minus stamp is an age free of any clock offset.
		now := o.clk.Now()
		var after signals.Cursor
		if a := q.Get(signals.AfterParam); local && a != "" {
			// Only the site's own gateway pages: a peer reads this site's
			// rows, which stay far below the cap.
			var ok bool
			if after, ok = signals.ParseCursor(a); !ok {
				http.Error(w, "signals: after must be a cursor from "+signals.RelayNextHeader, http.StatusBadRequest)
				return
			}
		}
		b := o.signalsAnswer(now, sel, local, after)
		h := w.Header()
		h.Set("Content-Type", signals.ContentType)
		h.Set("Date", now.UTC().Format(http.TimeFormat))
		h.Set("Age", strconv.FormatInt(b.ageSeconds(now), 10))
		h.Set("Cache-Control", "no-store")
		if maxWait > 0 {
			h.Set(signals.CursorHeader, cursor(version))
		}
		if next, ok := b.nextPage(); ok {
			h.Set(signals.RelayNextHeader, next.String())
		}
		w.Write(b.body)
	})
}

// signalsAnswer renders one answer at now: this site's rows and, for the
// Local caller, the peers' rows, from after on (the relay's next page).
func (o *Operator) signalsAnswer(now time.Time, sel selection, local bool, after signals.Cursor) answer {
	b := answer{paged: local, after: after}
	o.render(&b, signals.StoreSite, o.site.Current(now), now, sel)
	if local {
		o.render(&b, signals.StorePeers, o.peerStore.Current(now), now, sel)
	}
	return b
}

// isPeer reports whether site is a peer (configured, or admitted by gossip).
func (o *Operator) isPeer(site string) bool {
	_, ok := o.peer(site)
	return ok
}

// peer returns the configuration of a peer site (configured, or admitted by
// gossip).
func (o *Operator) peer(site string) (config.Peer, bool) {
	for _, p := range o.peers() {
		if p.Site == site {
			return p, true
		}
	}
	return config.Peer{}, false
}

// providerModels maps this site's provider names to their models.
func (o *Operator) providerModels() map[string]string {
	ps := o.cfg.Load().Providers
	out := make(map[string]string, len(ps))
	for i := range ps {
		out[ps[i].Name] = ps[i].Model
	}
	return out
}

// selection narrows an answer: target to one provider, collect to names.
// Parameters can only narrow what the caller may read.
type selection struct {
	target  string
	collect []string
	// peer, for a Peer caller, restricts the answer to the providers of
	// the models it may use (peers[].models); models maps this site's
	// providers to their models.
	peer   *config.Peer
	models map[string]string
}

func (s selection) wants(name string) bool {
	return len(s.collect) == 0 || slices.Contains(s.collect, name)
}

// answer accumulates a signals body.
type answer struct {
	body   []byte
	oldest int64 // the smallest stamp emitted, ms; 0 when nothing was
	full   bool  // the body cap was reached: later targets are dropped
	// paged answers (the Local caller's) defer what the cap cuts to the
	// next page instead of dropping it: after is where this page starts,
	// last the last target it carries.
	paged bool
	after signals.Cursor
	last  signals.Cursor
}

// nextPage is where the page after a paged answer the cap cut starts.
func (a *answer) nextPage() (signals.Cursor, bool) {
	return a.last, a.paged && a.full
}

func (a *answer) ageSeconds(now time.Time) int64 {
	if a.oldest == 0 {
		return 0
	}
	return max(0, (now.UnixMilli()-a.oldest)/1000)
}

// render appends the contract rows of entries, target by target: a target
// of more than 4096 lines is dropped whole, and once the next target would
// take the body to 768 KiB it and every later one are cut, so a receiver
// always sees whole batches. For the Local caller a cut is a page break:
// the answer names where the next page starts. Otherwise cut targets are
// dropped; drops are counted.
func (o *Operator) render(a *answer, store signals.RelayStore, entries []*Entry, now time.Time, sel selection) {
	var target []byte
	for _, e := range entries {
		if a.after.Covers(store, e.Target) {
			continue // on an earlier page
		}
		if sel.peer != nil && !sel.peer.MayUse(sel.models[e.Target]) {
			continue // not shared with this peer: no trace in the answer
		}
		if a.full {
			if !a.paged {
				o.m.peers.truncated.WithLabelValues(string(store), "target").Inc()
			}
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
		if lines > signals.MaxLinesPerTarget {
			o.m.peers.truncated.WithLabelValues(string(store), "lines").Inc()
			continue
		}
		if len(a.body)+len(target) >= signals.RelayBodyBytes {
			if a.paged && len(a.body) > 0 {
				a.full = true // the rest on the next page
				continue
			}
			// Alone past the cap: no page can carry it.
			o.m.peers.truncated.WithLabelValues(string(store), "target").Inc()
			a.full = !a.paged
			continue
		}
		a.body = append(a.body, target...)
		a.last = signals.Cursor{Store: store, Target: e.Target}
		if a.oldest == 0 || stamp < a.oldest {
			a.oldest = stamp
		}
	}
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
	doc := signals.Serving{Site: cfg.Site, Providers: []signals.ServingProvider{}, Peers: []signals.ServingPeer{},
		LoadWindowMs: (2*cfg.PeerPollInterval.D() + cfg.ScrapeInterval.D() + cfg.PeerPoll.Timeout.D()).Milliseconds()}
	for _, p := range cfg.Providers {
		sp := signals.ServingProvider{Name: p.Name, Model: p.Model, Upstream: p.Upstream}
		if a, _ := signals.ParseAdmission(p.Admission); a != signals.AdmitNewAndExisting {
			sp.Admission = a
		}
		doc.Providers = append(doc.Providers, sp)
	}
	for _, p := range o.peers() {
		doc.Peers = append(doc.Peers, signals.ServingPeer{Site: p.Site, Gateway: p.Gateway, Models: p.Models})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(doc)
}
