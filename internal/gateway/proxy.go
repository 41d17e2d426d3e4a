package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/grid-inference/grid/internal/affinity"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/connlimit"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/signals"
)

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

// MetricsConns bounds the metrics listener's open connections: a
// Prometheus server and a dashboard or two hold a handful.
const MetricsConns = 256

// Listener names one of the gateway's three listeners.
type Listener uint8

// The gateway's listeners.
const (
	// ClientListener serves the OpenAI API to clients.
	ClientListener Listener = iota
	// HopListener serves requests forwarded by peer gateways, over mTLS.
	HopListener
	// MetricsListener serves /metrics, the probes and the dashboard.
	MetricsListener

	numListeners
)

// Listeners lists every listener, in the order they are started.
var Listeners = []Listener{ClientListener, HopListener, MetricsListener}

// String is the listener's name in logs and in the listener label.
func (l Listener) String() string {
	switch l {
	case ClientListener:
		return "client"
	case HopListener:
		return "hop"
	case MetricsListener:
		return "metrics"
	}
	return fmt.Sprintf("Listener(%d)", uint8(l))
}

// Guard bounds ln, the given listener, by the configured limits, counting
// the connections it sheds. The limits follow reloads (Reload). The
// client listener also takes back the connections of detached streams
// (detach.go), which its server then serves again.
func (g *Gateway) Guard(listener Listener, ln net.Listener) net.Listener {
	shed, name := g.m.connsShed, listener.String()
	gl := connlimit.New(ln, connLimits(listener, g.cfg.Load().Limits), func(limit string) { shed.WithLabelValues(name, limit).Inc() })
	g.guards[listener].Store(gl)
	if listener == ClientListener {
		rj := newRejoinListener(gl)
		g.rejoin.Store(rj)
		return rj
	}
	return gl
}

// connLimits are a listener's connection caps under lim.
func connLimits(listener Listener, lim config.GatewayLimits) connlimit.Limits {
	switch listener {
	case ClientListener:
		return connlimit.Limits{Total: lim.ClientConns, PerSource: lim.ClientConnsPerSource, PerSource48: 4 * lim.ClientConnsPerSource}
	case HopListener:
		return connlimit.Limits{Total: lim.HopConns, PerSource: lim.HopConnsPerSource, PerSource48: 4 * lim.HopConnsPerSource}
	case MetricsListener:
		return connlimit.Limits{Total: MetricsConns}
	}
	panic("gateway: limits for " + listener.String())
}

// Server returns the HTTP server of one of the gateway's listeners. Client
// and hop requests may stream for as long as the model generates, so there
// is no write timeout; headers are bounded in size and time, and idle
// connections closed (a client's sooner: limits.clientIdleTimeout). The
// server tells the listener's guard which connections wait idle, so that
// those close first when the listener is full. Timeouts are read once, at
// start.
func (g *Gateway) Server(listener Listener, errLog *log.Logger) *http.Server {
	lim := g.cfg.Load().Limits
	srv := &http.Server{
		ReadHeaderTimeout: lim.HeaderReadTimeout.D(),
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          errLog,
		ConnState: func(c net.Conn, st http.ConnState) {
			if gl := g.guards[listener].Load(); gl != nil {
				gl.SetIdle(c, st == http.StateIdle)
			}
		},
	}
	switch listener {
	case ClientListener:
		srv.Handler = g.ClientHandler()
		srv.IdleTimeout = lim.ClientIdleTimeout.D()
		// Its requests' answers may be detached when the listener is
		// guarded, and their connections come back through it.
		srv.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
			if rj := g.rejoin.Load(); rj != nil {
				return context.WithValue(ctx, rejoinKey{}, rj)
			}
			return ctx
		}
	case HopListener:
		srv.Handler = g.HopHandler()
	case MetricsListener:
		srv.Handler = g.MetricsHandler()
	default:
		panic("gateway: server for " + listener.String())
	}
	return srv
}

// HopTLS is the hop listener's TLS configuration: the site's mTLS server
// configuration, offering HTTP/2 first, so that peer gateways reach this one
// over HTTP/2 and its ping liveness check (upstream.go).
func HopTLS(id *identity.Source) *tls.Config {
	c := id.ServerTLS()
	c.NextProtos = []string{"h2", "http/1.1"}
	return c
}

// ClientHandler serves the OpenAI API to clients.
func (g *Gateway) ClientHandler() http.Handler { return g.handler(false) }

// HopHandler serves requests forwarded by peer gateways, on the mTLS hop
// listener: the caller must verify as another grid site, and the request is
// routed among this site's providers only.
func (g *Gateway) HopHandler() http.Handler { return g.handler(true) }

func (g *Gateway) handler(hop bool) http.Handler {
	mux := http.NewServeMux()
	api := func(w http.ResponseWriter, r *http.Request) { g.serveAPI(w, r, hop) }
	mux.HandleFunc("POST /v1/chat/completions", api)
	mux.HandleFunc("POST /v1/completions", api)
	mux.HandleFunc("POST /v1/embeddings", api)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) { g.serveModels(w, r, hop) })
	mux.HandleFunc("GET /v1/models/{id...}", func(w http.ResponseWriter, r *http.Request) { g.serveModel(w, r, r.PathValue("id"), hop) })
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
	if !hop {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := g.id.Classify(r.TLS)
		peer, ok := g.peer(c.Site)
		if c.Class != identity.Peer || !ok {
			// A grid certificate is not enough: only this site's peers
			// (configured, or admitted by gossip) may send it requests.
			g.m.hopRefused.WithLabelValues(hopNotAPeer).Inc()
			w.Header().Set("Connection", "close")
			errHopForbidden.write(w, 0)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), hopPeerKey{}, peer)))
	})
}

// apiMethods is the method each OpenAI path the gateway serves answers.
var apiMethods = map[string]string{"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/embeddings": "POST", "/v1/models": "GET"}

// Reasons of grid_gateway_hop_refused_total.
const (
	hopNotAPeer       = "not_a_peer"
	hopModelNotShared = "model_not_shared"
)

// hopPeerKey carries the verified peer of a hop request in its context.
type hopPeerKey struct{}

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

func (g *Gateway) snapshot(hop bool) *route.Snapshot {
	if hop {
		return g.local.Load()
	}
	return g.builder.Current()
}

// serveModel answers GET /v1/models/{id} (the SDKs' models.retrieve) from
// the snapshot: the model if some site serves it, else 404 model_not_found.
func (g *Gateway) serveModel(w http.ResponseWriter, r *http.Request, id string, hop bool) {
	g.touch()
	snap, refusal := g.freshSnapshot(r.Context(), hop)
	if refusal != nil {
		refusal.write(w, g.turn.Add(1))
		return
	}
	if !slices.Contains(snap.Models(), id) {
		errModelNotFound.write(w, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "model", "created": 0, "owned_by": "grid"})
}

func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request, hop bool) {
	g.touch()
	snap, refusal := g.freshSnapshot(r.Context(), hop)
	if refusal != nil {
		refusal.write(w, g.turn.Add(1))
		return
	}
	var data []map[string]any
	for _, m := range snap.Models() {
		data = append(data, map[string]any{"id": m, "object": "model", "owned_by": "grid"})
	}
	if data == nil {
		data = []map[string]any{}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// serveAPI answers one OpenAI API request: read the body, find the model,
// pick a site from the snapshot, proxy (with one retry elsewhere when
// nothing reached the upstream). Every outcome is counted by its label in
// grid_gateway_request_duration_seconds.
func (g *Gateway) serveAPI(w http.ResponseWriter, r *http.Request, hop bool) {
	start := g.clk.Now()
	g.touch()
	outcome := "routed"
	observe := func(outcome string) {
		g.m.duration.WithLabelValues(outcome).Observe(g.clk.Now().Sub(start).Seconds())
	}
	// stream: the answer goes on after this handler returns (detach.go),
	// and is counted when it ends.
	var stream *detachedStream
	defer func() {
		if stream == nil {
			observe(outcome)
		}
	}()

	body, reserved, refusal := g.readBody(w, r)
	defer g.bodies.release(reserved)
	if refusal != nil {
		outcome = "bad_request"
		if refusal == &errBodyBudget {
			outcome = "body_budget"
			g.m.bodyBudgetRefused.Inc()
		}
		refusal.write(w, g.turn.Add(1))
		return
	}
	model := r.Header.Get(headerModel)
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
	if model == "" {
		model = head.model
	}
	if model == "" {
		outcome = "bad_request"
		g.m.decisions.WithLabelValues("", "", "bad_request").Inc()
		errModelRequired.write(w, 0)
		return
	}
	if peer, ok := r.Context().Value(hopPeerKey{}).(signals.ServingPeer); hop && ok && !peer.MayUse(model) {
		// This site does not share the model with that peer (its
		// peers[].models): it never saw the rows, and may not route here.
		outcome = "bad_request"
		g.m.hopRefused.WithLabelValues(hopModelNotShared).Inc()
		errHopForbidden.write(w, 0)
		return
	}
	var boundProvider string
	if hop {
		boundProvider = r.Header.Get(headerBoundProvider)
	}
	stripInternal(r.Header)
	turn := g.turn.Add(1)
	snap, refusal := g.freshSnapshot(r.Context(), hop)
	if refusal != nil {
		outcome = "not_ready"
		g.m.decisions.WithLabelValues("", "", "not_ready").Inc()
		g.hist.refused(refusal.Status)
		notDelivered(w, hop)
		refusal.write(w, turn)
		return
	}
	pick, sess := g.pick(r, snap, model, head.prompt, turn, hop, boundProvider)
	if pick.Candidate == nil {
		if pick.Outcome != route.Shed {
			notDelivered(w, hop)
		}
		outcome = g.refusePick(w, pick.Outcome, turn)
		return
	}
	var served affinity.Binding
	outcome, served, stream = g.proxy(w, r, outbound{body: body, stream: head.stream}, snap, model, pick, turn, hop)
	g.bind(sess, pick, served)
	if stream != nil {
		g.streams.start(stream, observe)
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
// budget has not 10 MiB left), else as the buffer grows. The buffer grows
// as bytes arrive, whatever was declared. It returns the bytes reserved, to
// release when the request is done (the body is kept for a retry).
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
		var tooBig *http.MaxBytesError
		switch {
		case err == nil:
			continue
		case err == io.EOF:
			return buf, reserved, nil
		case errors.As(err, &tooBig):
			return nil, reserved, &errTooLarge
		case errors.Is(err, os.ErrDeadlineExceeded):
			w.Header().Set("Connection", "close")
			return nil, reserved, &errBodyTimeout
		}
		return nil, reserved, &errBadBody
	}
}

// A body's first buffer, and what every request may hold outside the body
// budget: a chat request is a few KiB; the limits.clientConns cap bounds
// what the allowances add up to.
const (
	bodyChunk     = 16 << 10
	bodyAllowance = 64 << 10
)

// proxy forwards the request to the picked candidate and, when nothing
// reached that upstream or came back from it (docs/gateway.md, upstream
// failures), once more to the best-ordered other candidate not known to be
// down. It returns the request's outcome label, where it was served, and
// the detached stream that goes on copying the answer, if it was detached
// (detach.go; the caller starts it). A request that came over the hop and
// could not be delivered says so (headerNotDelivered), so the entry
// gateway tries elsewhere as it would for a refused connection.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, out outbound, snap *route.Snapshot, model string, pick route.Pick, turn uint64, hop bool) (string, affinity.Binding, *detachedStream) {
	for try := 0; try < 2; try++ {
		c := pick.Candidate
		reason := "routed"
		if pick.Outcome == route.Fallback {
			reason = "fallback"
		} else if try == 0 {
			g.m.selections.WithLabelValues(pick.Path.String()).Inc()
		}
		g.m.decisions.WithLabelValues(c.Site, c.Provider, reason).Inc()
		g.picks.add(c.Site)
		began := g.clk.Now()
		ans := answer{bound: pick.Path == route.PathSession}
		switch g.forward(w, r, out, c, began, &ans) {
		case delivered:
			served := affinity.Binding{Site: c.Site, Provider: ans.provider}
			if s := ans.detached; s != nil {
				room := pick.Room
				s.observe = func() { g.observeService(c.Site, began, &ans, room) }
				return "routed", served, s
			}
			g.observeService(c.Site, began, &ans, pick.Room)
			return "routed", served, nil
		case failed:
			return "upstream_error", affinity.Binding{}, nil
		}
		g.m.retries.Inc()
		pick = route.Pick{Outcome: route.Routed, Candidate: g.alternative(snap, model, c)}
		if pick.Candidate == nil {
			break
		}
	}
	notDelivered(w, hop)
	errUpstreamUnreachable.write(w, turn)
	return "upstream_error", affinity.Binding{}, nil
}

// notDelivered marks the answer to a hop request that reached none of this
// site's providers, so the entry gateway sends it elsewhere: every provider
// refused it, or this site has none ready for its model, its snapshot
// lags the entry gateway's (a backend that just died is known here first),
// or it has not read its operator. A shed (429) is not marked: the site is
// up and full, and says so to the client.
func notDelivered(w http.ResponseWriter, hop bool) {
	if hop {
		w.Header().Set(headerNotDelivered, "1")
	}
}

// alternative is the first candidate in snapshot order, other than tried,
// that serves model, is admitted and routable, and is not known to be down.
func (g *Gateway) alternative(snap *route.Snapshot, model string, tried *route.Candidate) *route.Candidate {
	for i := range snap.Candidates {
		c := &snap.Candidates[i]
		if c.Model == model && c.Admission == route.NewAndExisting && c.Upstream != nil &&
			healthKey(c) != healthKey(tried) && !g.health.isDown(c) {
			return c
		}
	}
	return nil
}

// refusePick answers a pick that carries no candidate and counts it.
func (g *Gateway) refusePick(w http.ResponseWriter, o route.Outcome, turn uint64) string {
	switch o {
	case route.Shed:
		g.m.decisions.WithLabelValues("", "", "shed").Inc()
		g.hist.refused(http.StatusTooManyRequests)
		errShed.write(w, turn)
		return "shed"
	case route.NotReady:
		g.m.decisions.WithLabelValues("", "", "not_ready").Inc()
		g.hist.refused(http.StatusServiceUnavailable)
		errNoHealthySite.write(w, turn)
		return "not_ready"
	case route.UnknownModel:
		g.m.decisions.WithLabelValues("", "", "bad_request").Inc()
		errModelNotFound.write(w, turn)
		return "model_not_found"
	default:
		g.m.decisions.WithLabelValues("", "", "no_route").Inc()
		errNoRoute.write(w, turn)
		return "no_route"
	}
}

// answer is what forward saw of an upstream's answer; the handler's
// goroutine only (the proxy copies the body on it), or, once the answer is
// detached, the detached stream's.
type answer struct {
	// bound: the attempt carries a session to the provider it is bound
	// to, which a peer gateway is told (headerBoundProvider). Set by the
	// caller.
	bound     bool
	stream    bool      // text/event-stream
	firstByte time.Time // the first byte of the body; zero before it
	// provider is the provider that answered: this site's, or the one a
	// peer gateway names (headerBackend).
	provider string
	// detached is the stream that copies the answer after the handler
	// returns (detach.go); nil when the proxy copied it.
	detached *detachedStream
}

// observeService tells the gateway's observed service (route.Service)
// what one delivered request says of service time: a stream its time to
// first byte and after it (a request that waited in an engine's queue
// waited before its first token), a whole answer its duration and whether
// the pick saw room.
func (g *Gateway) observeService(site string, began time.Time, ans *answer, room bool) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	end := g.clk.Now()
	if ans.stream && !ans.firstByte.IsZero() {
		g.service.ObserveStream(site, ms(ans.firstByte.Sub(began)), ms(end.Sub(ans.firstByte)))
	} else {
		g.service.Observe(site, ms(end.Sub(began)), room)
	}
}

// outbound is what the gateway sends upstream: the request's body, and
// whether it asked for a stream (requestHead.stream).
type outbound struct {
	body   []byte
	stream bool
}

// attempt is how one try to deliver a request ended.
type attempt uint8

const (
	// delivered: the upstream answered, whatever the status, and the
	// answer went to the client (or the client left).
	delivered attempt = iota
	// notSent: nothing reached the upstream, or nothing came back before
	// its connection was lost, and nothing reached the client: the request
	// may go elsewhere.
	notSent
	// failed: the upstream failed after the request reached it; the client
	// got a 502, or its stream was cut.
	failed
)

// errNotDelivered is a peer gateway's answer that it could not deliver a
// forwarded request to any of its providers (headerNotDelivered).
var errNotDelivered = errors.New("the peer gateway could not deliver the request to any of its providers")

// forward proxies one attempt to c, streaming the answer through
// unbuffered. Every failure is classified and counted
// (grid_gateway_upstream_errors_total) and told to passive health.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, out outbound, c *route.Candidate, began time.Time, ans *answer) (result attempt) {
	transport, err := g.upstreams.transport(c)
	if err != nil {
		g.log.Warn("no transport for upstream", "site", c.Site, "err", err)
		return notSent
	}
	tw := &trackingWriter{ResponseWriter: w}
	buffer := &copyBuffer{ans: ans}
	// An answer that may be detached (detach.go) outlives this handler,
	// and so must its upstream request: its context is the client's
	// without the client's end, cancelled when the client leaves while
	// the handler runs, and by the detached stream after. Only a request
	// that asks for a stream pays for that context.
	outCtx := r.Context()
	var via *rejoinListener
	if out.stream {
		via = detachVia(r)
	}
	var stopWatch func() bool
	var cancelOut context.CancelFunc
	if via != nil {
		outCtx, cancelOut = context.WithCancel(context.WithoutCancel(r.Context()))
		stopWatch = context.AfterFunc(r.Context(), cancelOut)
		defer func() {
			if ans.detached == nil {
				stopWatch()
				cancelOut()
			}
		}()
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			if via != nil {
				pr.Out = pr.Out.WithContext(outCtx)
			}
			pr.SetURL(c.Upstream)
			pr.SetXForwarded()
			if ans.bound && !c.Local {
				pr.Out.Header.Set(headerBoundProvider, c.Provider)
			}
			pr.Out.Body = io.NopCloser(bytes.NewReader(out.body))
			pr.Out.ContentLength = int64(len(out.body))
		},
		Transport:     transport,
		FlushInterval: -1,
		BufferPool:    buffer,
		ModifyResponse: func(resp *http.Response) error {
			if !c.Local && resp.Header.Get(headerNotDelivered) != "" {
				return errNotDelivered
			}
			g.health.answered(c, resp.StatusCode, began)
			ans.stream = strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
			resp.Header.Set(headerSite, c.Site)
			if c.Local || resp.Header.Get(headerBackend) == "" {
				resp.Header.Set(headerBackend, c.Provider)
			}
			ans.provider = resp.Header.Get(headerBackend)
			// A stream the upstream cuts is a failure of the upstream, seen
			// only while the body is copied; its first byte is the time to
			// first token the dashboard shows.
			resp.Body = &watchedBody{ReadCloser: resp.Body, ctx: outCtx,
				failed: func(err error) { g.upstreamFailed(c, upstreamStream, err, began) },
				firstByte: func() {
					ans.firstByte = g.clk.Now()
					g.hist.firstByte(c.Site, ans.firstByte.Sub(began))
				}}
			if via != nil && ans.stream && detachable(resp) {
				if s := detach(tw, resp, g.streams, via, outCtx, cancelOut); s != nil {
					stopWatch()
					ans.detached = s
					resp.Body = http.NoBody // ReverseProxy closes it
					// The upstream request's context keeps ReverseProxy's
					// 1xx trace, which holds tw for the whole stream: tw
					// lets the server's response go, and with it the
					// server connection's state and buffers.
					tw.ResponseWriter = nil
					return errDetached
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(err, errDetached) {
				result = delivered
				return
			}
			if req.Context().Err() != nil {
				return // the client went away; nothing to answer or count
			}
			kind := classifyUpstream(err)
			g.upstreamFailed(c, kind, err, began)
			if kind.nothingSent() && !tw.wrote {
				result = notSent
				return
			}
			result = failed
			if !tw.wrote {
				errUpstreamFailed.write(w, 0)
			}
		},
	}
	rp.ServeHTTP(tw, r)
	return result
}

// upstreamFailure classifies a failed attempt, the reason label of
// grid_gateway_upstream_errors_total.
type upstreamFailure string

// The upstream failures. The first five mean nothing reached the upstream
// or came back from it: the request may go elsewhere, and passive health
// takes the upstream out at once. The others mean the upstream had the
// request: they count toward passive health's streak of five.
const (
	upstreamRefused        upstreamFailure = "refused"         // connection refused or reset at connect
	upstreamConnectTimeout upstreamFailure = "connect_timeout" // no connection within upstream.connectTimeout
	upstreamTLS            upstreamFailure = "tls"             // handshake failed or timed out, or the wrong identity
	upstreamNotDelivered   upstreamFailure = "not_delivered"   // a peer gateway's providers all refused it
	upstreamLost           upstreamFailure = "connection_lost" // the connection died before any answer (a hop ping went unanswered)
	upstreamResponse       upstreamFailure = "response_timeout"
	upstreamStream         upstreamFailure = "stream" // the answer was cut after its headers
	upstreamTransport      upstreamFailure = "transport"
)

var upstreamFailures = []upstreamFailure{upstreamRefused, upstreamConnectTimeout, upstreamTLS, upstreamNotDelivered,
	upstreamLost, upstreamResponse, upstreamStream, upstreamTransport}

func (f upstreamFailure) nothingSent() bool {
	switch f {
	case upstreamRefused, upstreamConnectTimeout, upstreamTLS, upstreamNotDelivered, upstreamLost:
		return true
	}
	return false
}

// classifyUpstream reads a round trip's error.
func classifyUpstream(err error) upstreamFailure {
	var (
		op     *net.OpError
		alert  tls.AlertError
		record tls.RecordHeaderError
		cve    *tls.CertificateVerificationError
	)
	msg := err.Error()
	switch {
	case errors.Is(err, errNotDelivered):
		return upstreamNotDelivered
	case errors.As(err, &op) && op.Op == "dial":
		if op.Timeout() {
			return upstreamConnectTimeout
		}
		return upstreamRefused
	case errors.Is(err, syscall.ECONNREFUSED):
		return upstreamRefused
	case errors.As(err, &alert), errors.As(err, &record), errors.As(err, &cve), strings.Contains(msg, "TLS handshake timeout"):
		return upstreamTLS
	case strings.Contains(msg, "timeout awaiting response headers"):
		return upstreamResponse
	case strings.Contains(msg, "client connection lost"), strings.Contains(msg, "connection lost"):
		return upstreamLost
	}
	return upstreamTransport
}

// upstreamFailed counts a failure and tells passive health.
func (g *Gateway) upstreamFailed(c *route.Candidate, kind upstreamFailure, err error, began time.Time) {
	g.m.upstreamErrors.WithLabelValues(c.Site, string(kind)).Inc()
	g.log.Debug("upstream failure", "site", c.Site, "provider", c.Provider, "reason", kind, "err", err)
	if kind.nothingSent() {
		g.health.failed(c)
		return
	}
	g.health.answered(c, http.StatusBadGateway, began)
}

// watchedBody reports the first error reading an upstream's answer, other
// than its end or the client's leaving.
type watchedBody struct {
	io.ReadCloser
	ctx       context.Context
	failed    func(error)
	firstByte func()
	once      sync.Once
	read      bool // a byte was read; the copying goroutine only
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.read {
		b.read = true
		b.firstByte()
	}
	if err != nil && err != io.EOF && b.ctx.Err() == nil {
		b.once.Do(func() { b.failed(err) })
	}
	return n, err
}

// trackingWriter notes whether anything reached the client.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackingWriter) WriteHeader(code int) { t.wrote = true; t.ResponseWriter.WriteHeader(code) }
func (t *trackingWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}
func (t *trackingWriter) Flush() {
	if f, ok := t.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// copyBuffer gives the proxy its copy buffer for one answer: a stream's
// small, because an SSE stream holds it, mostly idle, for as long as the
// model generates, and its events are a few hundred bytes; any other
// answer's large, to copy a big body in few reads. The proxy asks for the
// buffer after ModifyResponse has seen the answer's Content-Type (and set
// ans.stream). A stream that is not detached (detach.go) copies through
// it.
type copyBuffer struct {
	ans *answer
}

// Buffer sizes; both pooled.
const (
	streamBufferSize = 2 << 10
	bulkBufferSize   = 32 << 10
)

var (
	streamBuffers = sync.Pool{New: func() any { b := make([]byte, streamBufferSize); return &b }}
	bulkBuffers   = sync.Pool{New: func() any { b := make([]byte, bulkBufferSize); return &b }}
)

func (c *copyBuffer) Get() []byte {
	if c.ans.stream {
		return *streamBuffers.Get().(*[]byte)
	}
	return *bulkBuffers.Get().(*[]byte)
}

func (c *copyBuffer) Put(b []byte) {
	if len(b) == streamBufferSize {
		streamBuffers.Put(&b)
	} else {
		bulkBuffers.Put(&b)
	}
}

// DrainStreams waits until every detached stream has ended, or ctx is
// done; then it cuts those left. Call it after the client listener's
// server has shut down: the server does not wait for them.
func (g *Gateway) DrainStreams(ctx context.Context) error { return g.streams.drain(ctx) }

// Close cuts the detached streams still running and releases idle
// upstream connections.
func (g *Gateway) Close() {
	g.streams.cutAndWait()
	g.upstreams.close()
	g.opClient.CloseIdleConnections()
}
