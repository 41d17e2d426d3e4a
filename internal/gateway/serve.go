package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/signals"
)

// Serving a request: the handlers of the client and hop listeners, reading
// a request, and routing it; forward.go delivers it.

// maxBody bounds a request body; the model is read from it.
const maxBody = 10 << 20

// Headers.
const (
	headerModel   = "X-Model"
	headerSite    = "X-Grid-Site"
	headerBackend = "X-Grid-Backend"
	// headerNotDelivered, on a peer gateway's 502, says that none of its
	// providers could be reached before any byte was sent: the entry
	// gateway may send the request elsewhere (docs/gateway.md).
	headerNotDelivered = "X-Grid-Not-Delivered"
)

// stripInternal removes from a request every header of the namespaces Grid
// and routing layers use among themselves, X-Grid-* and X-Ai-Routing-*: a
// client must not be able to steer routing or forge provenance with them.
// Keys are canonical here (the server canonicalised them).
func stripInternal(h http.Header) {
	for k := range h {
		if strings.HasPrefix(k, "X-Grid-") || strings.HasPrefix(k, "X-Ai-Routing-") {
			delete(h, k)
		}
	}
}

// ClientHandler serves the OpenAI API to clients: every site's candidates
// are routed among. Once LameDuck was called, every answer closes
// its connection.
func (g *Gateway) ClientHandler() http.Handler {
	api := g.apiMux()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.clientActive.Add(1)
		defer g.clientActive.Add(-1)
		if g.closingConns.Load() {
			w.Header().Set("Connection", "close")
		}
		api.ServeHTTP(w, r)
	})
}

// LameDuck begins a drain of the client listener: it stops accepting
// connections (its socket closes; a replacement gateway bound with
// SO_REUSEPORT takes the new ones) and every later answer closes its
// connection (Connection: close), detached streams' too, so that clients
// sending on kept-alive connections are told to go. A drain calls it a
// moment before the server closes the idle connections: closed at once,
// an idle connection races the request its client is writing on it. Any
// goroutine.
func (g *Gateway) LameDuck() {
	g.closingConns.Store(true)
	if rj := g.rejoin.Load(); rj != nil {
		rj.stopAccepting()
	}
}

// LameDuckFor is the least time a draining client listener keeps
// answering requests on kept-alive connections, each answer closing its
// connection, before the server closes the idle ones.
const LameDuckFor = time.Second

// QuietClients begins a drain of the client listener (LameDuck) and
// returns once its clients have been told to go: after LameDuckFor, when
// no request is being answered on it, no detached stream runs and no
// client connection is left open, or when ctx is done. Until then the
// server still answers what comes on its connections, among them those
// that streams begun before the drain hand back (their head promised
// keep-alive, so their clients send again on them): each gets one more
// answer, closing it. A connection the server closes while its client
// holds it idle races the request the client may be writing on it, which
// then fails (EOF, or a reset: 3 to 7 requests a restart of `grid bench
// sites` at K = 3, when the server closed the connections streams handed
// back once the streams were over). So the clients' kept-alive
// connections are left for them to use once more or to close, until
// DrainGrace before ctx's deadline; the server's Shutdown that follows
// closes those still open.
func (g *Gateway) QuietClients(ctx context.Context) {
	g.LameDuck()
	t := time.NewTimer(LameDuckFor)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	// Without a deadline the wait for idle connections has no bound: it
	// is not made.
	leaveBy, bounded := ctx.Deadline()
	leaveBy = leaveBy.Add(-DrainGrace)
	tick := time.NewTicker(quietPoll)
	defer tick.Stop()
	for {
		busy := g.clientActive.Load() > 0 || g.streams.busy()
		if !busy && (!bounded || g.openClientConns() == 0 || !time.Now().Before(leaveBy)) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// openClientConns is the number of open connections on the guarded
// client listener (detached streams' and those they handed back
// included); 0 when it is not guarded.
func (g *Gateway) openClientConns() int {
	if gl := g.guards[ClientListener].Load(); gl != nil {
		return gl.Open()
	}
	return 0
}

// quietPoll is how often QuietClients looks for a quiet client listener.
const quietPoll = 20 * time.Millisecond

// HopHandler serves requests forwarded by peer gateways, on the mTLS hop
// listener: the caller must verify as one of this site's peers, and the
// request is routed among this site's providers only.
func (g *Gateway) HopHandler() http.Handler { return &hopHandler{g: g, api: g.apiMux()} }

// hopHandler admits a peer gateway's request and serves it with the peer in
// its context (hopPeerKey): that is what makes it a hop request for the API
// handlers (fromPeer).
type hopHandler struct {
	g   *Gateway
	api http.Handler
}

func (h *hopHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.g.id.Classify(r.TLS)
	if c.Class == identity.Peer && h.g.serving.Load() == nil {
		// Who this site's peers are comes from its operator, which this
		// gateway (just started) has not read yet: the request is not
		// refused as a stranger's but handed back undelivered, and the
		// entry gateway tries elsewhere (a restarted gateway answered
		// 403 to its peers until its first poll).
		w.Header().Set(headerNotDelivered, "1")
		errOperatorUnreachable.write(w, 0)
		return
	}
	peer, ok := h.g.peer(c.Site)
	if c.Class != identity.Peer || !ok {
		// A grid certificate is not enough: only this site's peers
		// (configured, or admitted by gossip) may send it requests.
		h.g.m.hopRefused.WithLabelValues(hopNotAPeer).Inc()
		w.Header().Set("Connection", "close")
		errHopForbidden.write(w, 0)
		return
	}
	if r.URL.Path == hopPingPath {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	hr := &hopRequest{peer: peer}
	h.api.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), hopPeerKey{}, hr)))
	if t := hr.tail; t != nil {
		t.run() // the rest of an event stream, a few frames deep (tail.go)
	}
}

// hopPingPath is the hop's round-trip probe (probe.go): a peer gateway's
// GET is answered 204 and nothing else.
const hopPingPath = "/v1/grid/ping"

// apiMux routes the OpenAI API's paths; a request's origin (a client, or a
// peer over the hop) is in its context.
func (g *Gateway) apiMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", g.serveAPI)
	mux.HandleFunc("POST /v1/completions", g.serveAPI)
	mux.HandleFunc("POST /v1/embeddings", g.serveAPI)
	mux.HandleFunc("GET /v1/models", g.serveModels)
	mux.HandleFunc("GET /v1/models/{id...}", g.serveModel)
	// Anything else under /v1/ gets an OpenAI error, as the SDKs expect: a
	// known path with another method 405 (with Allow), an unknown one 404.
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		if m, ok := apiMethods[r.URL.Path]; ok || strings.HasPrefix(r.URL.Path, "/v1/models/") {
			if !ok {
				m = "GET"
			}
			w.Header().Set("Allow", m)
			errMethodNotAllowed.write(w, 0)
			return
		}
		errUnknownURL.write(w, 0)
	})
	return mux
}

// apiMethods is the method each OpenAI path the gateway serves answers.
var apiMethods = map[string]string{"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/embeddings": "POST", "/v1/models": "GET"}

// Reasons of grid_gateway_hop_refused_total.
const (
	hopNotAPeer       = "not_a_peer"
	hopModelNotShared = "model_not_shared"
)

// hopPeerKey carries a hop request's *hopRequest in its context.
type hopPeerKey struct{}

// hopRequest is what the hop handler knows of a request it admitted: the
// verified peer it came from, and, once forward has relayed the head of an
// event stream, the rest of that stream, which the hop handler copies
// after the API handler has returned (tail.go). The handler's goroutine
// only.
type hopRequest struct {
	peer signals.ServingPeer
	tail *streamTail
}

// hopOf returns the hop request ctx belongs to, or nil for a client's.
func hopOf(ctx context.Context) *hopRequest {
	hr, _ := ctx.Value(hopPeerKey{}).(*hopRequest)
	return hr
}

// peer returns one of this site's peers, as the operator's serving
// document lists them.
func (g *Gateway) peer(site string) (signals.ServingPeer, bool) {
	if s := g.serving.Load(); s != nil {
		for _, p := range s.Peers {
			if p.Site == site {
				return p, true
			}
		}
	}
	return signals.ServingPeer{}, false
}

// fromPeer returns the verified peer a hop request came from, or nil for a
// client's request.
func fromPeer(ctx context.Context) *signals.ServingPeer {
	if hr := hopOf(ctx); hr != nil {
		return &hr.peer
	}
	return nil
}

// view is the snapshot a request from peer routes on: a client's, every
// site's candidates; a peer's, this site's own (the hop view), since a
// forwarded request is never forwarded again.
func (g *Gateway) view(peer *signals.ServingPeer) *route.Snapshot {
	if peer != nil {
		return g.local.Load()
	}
	return g.builder.Current()
}

// serveModel answers GET /v1/models/{id} (the SDKs' models.retrieve) from
// the snapshot: the model if some site serves it, else 404 model_not_found.
func (g *Gateway) serveModel(w http.ResponseWriter, r *http.Request) {
	g.touch()
	if refusal := g.awaitFresh(r.Context()); refusal != nil {
		refusal.write(w, g.turn.Add(1))
		return
	}
	id := r.PathValue("id")
	if !slices.Contains(g.view(fromPeer(r.Context())).Models(), id) {
		modelNotFound(id).write(w, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "model", "created": g.modelCreated(id), "owned_by": "grid"})
}

func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request) {
	g.touch()
	if refusal := g.awaitFresh(r.Context()); refusal != nil {
		refusal.write(w, g.turn.Add(1))
		return
	}
	var data []map[string]any
	for _, m := range g.view(fromPeer(r.Context())).Models() {
		data = append(data, map[string]any{"id": m, "object": "model", "created": g.modelCreated(m), "owned_by": "grid"})
	}
	if data == nil {
		data = []map[string]any{}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// exchange is one API request being served: what it asked, where it came
// from, and what routing made of it. The handler's goroutine only; a
// detached stream (detach.go) takes over what it needs when the handler
// returns.
type exchange struct {
	g *Gateway
	w http.ResponseWriter
	r *http.Request
	// peer is the verified peer gateway a hop request came from; nil for
	// a client's request.
	peer *signals.ServingPeer
	turn uint64
	// out is what goes upstream; model the model it asks for.
	out   outbound
	model string
	// boundProvider is, on a hop request, the provider of this site the
	// entry gateway's session is bound to (headerBoundProvider).
	boundProvider string
	snap          *route.Snapshot
	// sess is the request's session (affinity), and attempt the pick the
	// attempt under way carries: the session is bound where the attempt's
	// answer comes from, as its headers arrive (forward), before the
	// client can read the answer and send its next turn.
	sess    session
	attempt route.Pick
	// cost is the request's estimated size (cost.go).
	cost route.Cost
	// holder is the request's place in its model's hold line until its
	// first attempt has begun (hold.go); nil when it was not held.
	holder *holder
	// aborted is the outcome of an attempt the proxy aborted mid-answer
	// (forwardCounted); empty otherwise.
	aborted string
	// tail is the rest of a hop request's event stream, left by forward
	// for the hop handler to copy (tail.go); nil otherwise.
	tail *streamTail
}

// serveAPI answers one OpenAI API request: read the body, find the model,
// pick a site from the snapshot, deliver it (with one retry elsewhere when
// nothing reached the upstream). Every outcome is counted by its label in
// grid_gateway_request_duration_seconds.
func (g *Gateway) serveAPI(w http.ResponseWriter, r *http.Request) {
	start := g.clk.Now()
	// x stays on this goroutine's stack: nothing that outlives the handler
	// (observe, a detached stream) holds it.
	x := &exchange{g: g, w: w, r: r, peer: fromPeer(r.Context())}
	g.touch()
	outcome := "routed"
	observe := func(outcome string) {
		g.m.duration.WithLabelValues(outcome).Observe(g.clk.Now().Sub(start).Seconds())
	}
	// stream and tailed: the answer goes on after this handler returns
	// (detach.go, tail.go), and is counted when it ends.
	var stream *detachedStream
	var tailed bool
	defer func() {
		if stream == nil && !tailed {
			if x.aborted != "" {
				outcome = x.aborted // the proxy's panic skipped the rest
			}
			observe(outcome)
		}
	}()

	body, reserved, refusal := g.readBody(w, r)
	x.out.held = g.bodies.hold(reserved)
	defer x.out.letGo()
	if refusal != nil {
		outcome = "bad_request"
		if refusal == &errBodyBudget {
			outcome = "body_budget"
			g.m.bodyBudgetRefused.Inc()
		}
		refusal.write(w, g.turn.Add(1))
		return
	}
	head, err := parseRequest(body)
	var bad *apiError
	switch err {
	case errInvalidJSON:
		bad = &apiInvalidJSON
	case errAmbiguousModel:
		bad = &apiAmbiguousModel
	}
	if bad != nil {
		outcome = "bad_request"
		g.m.decisions.WithLabelValues("", "", "bad_request").Inc()
		bad.write(w, 0)
		return
	}
	x.out.body, x.out.stream = body, head.stream
	x.cost = head.cost
	if x.peer == nil { // a hop request was counted at its entry gateway
		g.countCost(head.cost)
	}
	if x.model = r.Header.Get(headerModel); x.model == "" {
		x.model = head.model
	}
	if x.model == "" {
		outcome = "bad_request"
		g.m.decisions.WithLabelValues("", "", "bad_request").Inc()
		errModelRequired.write(w, 0)
		return
	}
	if x.peer != nil && !x.peer.MayUse(x.model) {
		// This site does not share the model with that peer (its
		// peers[].models): it never saw the rows, and may not route here.
		outcome = "bad_request"
		g.m.hopRefused.WithLabelValues(hopModelNotShared).Inc()
		errHopForbidden.write(w, 0)
		return
	}
	if x.peer != nil {
		x.boundProvider = r.Header.Get(headerBoundProvider)
	}
	stripInternal(r.Header)
	x.turn = g.turn.Add(1)
	if refusal := g.awaitFresh(r.Context()); refusal != nil {
		outcome = "not_ready"
		g.m.decisions.WithLabelValues("", "", "not_ready").Inc()
		g.hist.refused(refusal.Status)
		x.notDelivered()
		refusal.write(w, x.turn)
		return
	}
	holder, gone := x.hold(r.Context())
	if gone {
		outcome = "client_gone"
		return
	}
	x.holder = holder
	defer x.unhold()
	x.snap = g.view(x.peer)
	pick, sess := x.pick(head.prompt)
	x.sess = sess
	if pick.Candidate == nil {
		if pick.Outcome != route.Shed {
			x.notDelivered()
		}
		outcome = g.refusePick(w, x.model, pick.Outcome, x.turn)
		return
	}
	outcome, detached := x.deliver(pick)
	if stream = detached; stream != nil {
		g.streams.start(stream, observe)
	} else if t := x.tail; t != nil {
		t.end, tailed = observe, true
	}
}

// notDelivered marks the answer to a hop request that reached none of this
// site's providers, so the entry gateway sends it elsewhere: every provider
// refused it, or this site has none ready for its model, its snapshot
// lags the entry gateway's (a backend that just died is known here first),
// or it has not read its operator. A shed (429) is not marked: the site is
// up and full, and says so to the client.
func (x *exchange) notDelivered() {
	if x.peer != nil {
		x.w.Header().Set(headerNotDelivered, "1")
	}
}

// readBody reads the request body whole, bounded in size, in time (under a
// deadline lifted once it is in: a client that trickles its body must not
// hold a connection forever, and a stream that follows must not be cut by
// it; deadlines are wall time, whatever clock the routing runs on), and by
// the gateway-wide body budget. Every request may hold bodyAllowance bytes
// without touching the budget, so the ordinary small request is never
// refused for it; what a body holds beyond that is reserved from the budget
// before it is read: all of it at once when the client declared its length
// (so a client that declares 10 MiB and stalls is refused at once when the
// budget has not 10 MiB left), else as the buffer grows. A declared body's
// buffer takes its whole length once the first chunk is full: grown by
// doubling, the arrays it outgrew were garbage the budget did not count,
// and 60 stalled 10 MiB bodies held 964 MiB of RSS against a 512 MiB
// budget. An undeclared body's grows by doubling as bytes arrive. It
// returns the bytes reserved, to release when the request is done (the
// body is kept for a retry).
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) (body []byte, reserved int64, refusal *apiError) {
	if r.ContentLength > maxBody {
		return nil, 0, &errTooLarge
	}
	declared := r.ContentLength >= 0
	limit := int64(maxBody + 1)
	if declared {
		limit = r.ContentLength + 1 // room to see the end
		if need := limit - bodyAllowance; need > 0 {
			if !g.bodies.reserve(need) {
				w.Header().Set("Connection", "close")
				return nil, 0, &errBodyBudget
			}
			reserved = need
		}
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(g.cfg.Load().Limits.BodyReadTimeout.D()))
	defer rc.SetReadDeadline(time.Time{})
	in := http.MaxBytesReader(w, r.Body, maxBody)
	buf := make([]byte, 0, min(limit, bodyChunk))
	for {
		if len(buf) == cap(buf) {
			size := min(2*int64(cap(buf)), limit)
			if declared {
				size = limit // reserved already: one array, no garbage
			}
			if size <= int64(cap(buf)) {
				return nil, reserved, &errTooLarge
			}
			if need := size - max(int64(cap(buf)), bodyAllowance); !declared && need > 0 {
				if !g.bodies.reserve(need) {
					w.Header().Set("Connection", "close")
					return nil, reserved, &errBodyBudget
				}
				reserved += need
			}
			next := make([]byte, len(buf), size)
			copy(next, buf)
			buf = next
		}
		n, err := in.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case err == nil:
			continue
		case err == io.EOF:
			return buf, reserved, nil
		case tooBig(err):
			return nil, reserved, &errTooLarge
		case errors.Is(err, os.ErrDeadlineExceeded):
			w.Header().Set("Connection", "close")
			return nil, reserved, &errBodyTimeout
		}
		return nil, reserved, &errBadBody
	}
}

// tooBig: err says a body went past http.MaxBytesReader's limit. A
// function of its own, so the target errors.As needs is made only for a
// failed read, not for every request.
func tooBig(err error) bool {
	var e *http.MaxBytesError
	return errors.As(err, &e)
}

// A body's first buffer, and what every request may hold outside the body
// budget: a chat request is a few KiB; the limits.clientConns cap bounds
// what the allowances add up to.
const (
	bodyChunk     = 16 << 10
	bodyAllowance = 64 << 10
)

// refusePick answers a pick for model that carries no candidate and counts
// it.
func (g *Gateway) refusePick(w http.ResponseWriter, model string, o route.Outcome, turn uint64) string {
	switch o {
	case route.Shed:
		g.m.decisions.WithLabelValues("", "", "shed").Inc()
		g.hist.refused(http.StatusTooManyRequests)
		errShed.about("every site serving model %q is at capacity", model).write(w, turn)
		return "shed"
	case route.NotReady:
		g.m.decisions.WithLabelValues("", "", "not_ready").Inc()
		g.hist.refused(http.StatusServiceUnavailable)
		errNoHealthySite.about("no site serving model %q is ready now", model).write(w, turn)
		return "not_ready"
	case route.UnknownModel:
		g.m.decisions.WithLabelValues("", "", "bad_request").Inc()
		modelNotFound(model).write(w, turn)
		return "model_not_found"
	default:
		g.m.decisions.WithLabelValues("", "", "no_route").Inc()
		errNoRoute.about("no route reaches the sites serving model %q", model).write(w, turn)
		return "no_route"
	}
}

// modelNotFound is the 404 for a model no site serves, pointing to the
// list of those served.
func modelNotFound(model string) apiError {
	return errModelNotFound.about("no site serves model %q; GET /v1/models lists the models this gateway routes", model)
}
