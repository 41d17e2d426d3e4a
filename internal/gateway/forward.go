package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/grid-inference/grid/internal/affinity"
	"github.com/grid-inference/grid/internal/h1client"
	"github.com/grid-inference/grid/internal/route"
)

// Forwarding an attempt: delivering a routed request to its upstream (a
// provider of this site, or a peer site's gateway), streaming the answer
// back, classifying what failed, and retrying once where nothing was sent.

// deliver forwards the request to the picked candidate and, when nothing
// reached that upstream or came back from it (docs/gateway.md, upstream
// failures), once more to the best-ordered other candidate not known to be
// down, or, when there is none and a provider of this site took too long
// to accept the connection, to the same one on a fresh connection. It
// returns the request's outcome label, where it was served, and the
// detached stream that goes on copying the answer, if it was detached
// (detach.go; the caller starts it). A request that came over the hop and
// could not be delivered says so (headerNotDelivered), so the entry
// gateway tries elsewhere as it would for a refused connection. The
// request's session is bound where it was served (forward).
func (x *exchange) deliver(pick route.Pick) (string, *detachedStream) {
	g := x.g
	var tried [2]string
	again := false // the second try went to the same candidate
tries:
	for try := range 2 {
		c := pick.Candidate
		tried[try] = c.Site
		reason := "routed"
		if pick.Outcome == route.Fallback {
			reason = "fallback"
		} else if try == 0 {
			g.m.selections.WithLabelValues(pick.Path.String()).Inc()
		}
		g.m.decisions.WithLabelValues(c.Site, c.Provider, reason).Inc()
		g.picks.add(c.Site)
		began := g.clk.Now()
		// Every site's count of the requests this gateway routed is kept
		// (route.Served), not of those a peer gateway routed here over
		// the hop: they are the peer's. Only a remote site's board is
		// judged by what its answers show.
		var sv *route.Served
		if x.peer == nil || !c.Local {
			sv = g.service.Served(c.Site, c.Model)
		}
		ans := answer{bound: pick.Path == route.PathSession}
		if !c.Local {
			ans.served = sv
		}
		sv.Begin(g.timeline.NowMs())
		x.unhold() // counted: the next in its line may look
		x.attempt = pick
		ob := observation{site: c.Site, local: c.Local, served: sv, began: began, room: pick.Room, load: pick.Load, cost: x.cost}
		switch x.forwardCounted(c, began, &ans, sv) {
		case delivered:
			if s := ans.detached; s != nil {
				ob := ob // the stream's own, so the attempt's stays on the stack
				s.observe = func(whole bool) { g.observeService(&ob, &ans, whole) }
				return "routed", s
			}
			if t := x.tail; t != nil {
				ob := ob
				t.observe = func(whole bool) { g.observeService(&ob, &ans, whole) }
				return "routed", nil
			}
			g.observeService(&ob, &ans, true)
			return "routed", nil
		case failed:
			sv.End(g.timeline.NowMs())
			return "upstream_error", nil
		}
		sv.End(g.timeline.NowMs())
		if try == 1 {
			break
		}
		switch next := g.alternative(x.snap, x.model, c); {
		case next != nil:
			pick = route.Pick{Outcome: route.Routed, Candidate: next}
		case c.Local && ans.failure == upstreamConnectTimeout:
			// Nowhere else to go, and a provider that did not take the
			// connection in time may only be slow to accept it: a burst
			// of new connections past its listen queue has its SYNs
			// dropped, and the kernel resends one a second, then three,
			// after the first. The same pick, on a fresh connection.
			again = true
		default:
			break tries
		}
		g.m.retries.Inc()
	}
	x.notDelivered()
	unreachable := errUpstreamUnreachable.about("site %q could not be reached", tried[0])
	if again {
		unreachable = errUpstreamUnreachable.about("site %q could not be reached (its provider tried twice)", tried[0])
	} else if tried[1] == tried[0] {
		unreachable = errUpstreamUnreachable.about("site %q could not be reached (two of its providers tried)", tried[0])
	} else if tried[1] != "" {
		unreachable = errUpstreamUnreachable.about("site %q could not be reached, nor site %q after it", tried[0], tried[1])
	}
	unreachable.write(x.w, x.turn)
	return "upstream_error", nil
}

// forwardCounted is forward for an attempt counted in sv (Served.Begin):
// when the proxy aborts the handler (it panics with http.ErrAbortHandler
// when the client leaves while the answer is copied, or the upstream
// breaks an answer that is not an event stream), the attempt's count ends
// on the way out, which the code after forward never reaches, and the
// request's outcome says which of the two it was. A count left behind
// would read the site as holding the request for good
// (TestClientCutEndsItsCount).
func (x *exchange) forwardCounted(c *route.Candidate, began time.Time, ans *answer, sv *route.Served) attempt {
	returned := false
	defer func() {
		if !returned {
			sv.End(x.g.timeline.NowMs())
			x.aborted = "client_gone"
			if ans.failure != "" {
				x.aborted = "upstream_error"
			}
		}
	}()
	result := x.forward(c, began, ans)
	returned = true
	return result
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
	// served is the remote site's observed service, which a stream's
	// first byte is judged against (judgeStream); nil for this site's
	// providers. Set by the caller.
	served *route.Served
	// provider is the provider that answered: this site's, or the one a
	// peer gateway names (headerBackend).
	provider string
	// detached is the stream that copies the answer after the handler
	// returns (detach.go); nil when the proxy copied it.
	detached *detachedStream
	// failure is why the attempt failed, when it did.
	failure upstreamFailure
}

// observation is what an attempt's answer is observed against: where it
// went (served: the site's observed service, judged for a remote site
// only), when, what its pick read (room, and the site's predicted load),
// and the request's estimated size.
type observation struct {
	site   string
	local  bool
	served *route.Served
	began  time.Time
	room   bool
	load   route.Opt
	cost   route.Cost
}

// observeService tells the gateway's observed service (route.Service)
// what one delivered request says of service time: a stream its time to
// first byte and after it (a request that waited in an engine's queue
// waited before its first token), a whole answer its duration and whether
// the pick saw room. A remote site's observed service learns that the
// request ended and how long it waited, which its board may be seen to
// contradict (route.Served). A stream also teaches what its size cost
// (route.CostModel) and, against the load its site was predicted at, the
// wait it met (route.WaitCurve): its time to first token less the round
// trip and its prefill. An answer that did not end whole teaches nothing.
func (g *Gateway) observeService(ob *observation, ans *answer, whole bool) {
	if !whole {
		ob.served.End(g.timeline.NowMs())
		return
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	end := g.clk.Now()
	stream := ans.stream && !ans.firstByte.IsZero()
	first := ms(end.Sub(ob.began))
	if stream {
		first = ms(ans.firstByte.Sub(ob.began))
	}
	// A whole answer's wait is judged before it teaches the estimates, so
	// an answer is not compared with itself; a stream's was at its first
	// byte (judgeStream).
	now := g.timeline.NowMs()
	if !ob.local && !stream {
		total := ms(end.Sub(ob.began))
		ob.served.Judge(now, g.service.Waited(ob.site, false, float64(now)-total, total, total, ob.cost))
	}
	ob.served.End(now)
	if !stream {
		g.service.Observe(ob.site, ms(end.Sub(ob.began)), ob.room)
		return
	}
	decode := ms(end.Sub(ans.firstByte))
	atSite := first
	if !ob.local {
		atSite = g.service.AtSiteMs(ob.site, first)
	}
	if waited, ok := g.service.Costs().WaitMs(ob.cost, atSite); ok && ob.load.OK {
		g.service.Waits(ob.site).Observe(ob.load.V, waited)
	}
	g.service.Costs().Observe(ob.cost, atSite, decode, ob.room)
	g.service.ObserveStream(ob.site, first, decode)
}

// judgeStream judges a remote stream's wait at its first byte, first after
// it was sent (route.Served.Judge): its wait has just ended, and the
// readings taken during it are among the site's latest claims, which a
// judgement at the stream's end, seconds or a minute of decode later,
// would no longer hold.
func (g *Gateway) judgeStream(site string, sv *route.Served, first time.Duration, c route.Cost) {
	now, firstMs := g.timeline.NowMs(), float64(first)/float64(time.Millisecond)
	sv.Judge(now, g.service.Waited(site, true, float64(now)-firstMs, firstMs, firstMs, c))
}

// outbound is what the gateway sends upstream: the request's body, and
// whether it asked for a stream (requestHead.stream). The handler's
// goroutine only.
type outbound struct {
	body []byte
	// held is the body's budget reservation (nil within the allowance):
	// the handler holds it until letGo, and every attempt until its
	// transport lets go of the body.
	held   *heldBody
	stream bool
	// released: the handler's hold is let go.
	released bool
}

// letGo ends the handler's hold on the body: once an answer has come no
// attempt follows, so the handler need not keep the bytes for the rest of
// a stream it copies itself, nor count them against the budget after the
// transport has let go of them too. The handler's return calls it again,
// to no effect.
func (o *outbound) letGo() {
	if !o.released {
		o.released = true
		o.held.letGo()
	}
	o.body = nil
}

// setBody makes req's body a fresh reading of the request's bytes, held
// against the body budget until the transport has read it whole or closed
// it, and lets the transport read them again (GetBody) until the
// attempt's answer has come (the rewind's disarm). A transport sends a
// request again only when the upstream cannot have processed it: an
// HTTP/2 stream refused, or opened after the peer's graceful-shutdown
// GOAWAY; an HTTP/1 connection that failed before anything was written.
// Without GetBody such a request, its body written, failed as a 502 (a
// rolling restart of a peer gateway: TestRefusedStreamIsSentAgain).
func (o *outbound) setBody(req *http.Request) *rewind {
	rw := &rewind{held: o.held, body: o.body}
	req.Body = o.held.attempt(o.body)
	req.ContentLength = int64(len(o.body))
	req.GetBody = rw.get
	return rw
}

// rewind is what an attempt's GetBody reads the request's bytes again
// from. Once the attempt's answer has come no transport sends the request
// again, and disarm lets go of the bytes: the request stays reachable from
// its answer (its Request field, and the HTTP/2 transport's stream) for as
// long as a stream lasts, and armed, it pinned a body of up to 10 MiB per
// stream after the budget had counted it released
// (TestStreamDoesNotPinItsRequestBody).
type rewind struct {
	held *heldBody
	mu   sync.Mutex
	body []byte // under mu, as disarmed
	// disarmed: the answer has come, and body is let go.
	disarmed bool
}

// errRewound is GetBody's error once the answer has come.
var errRewound = errors.New("the request's body is no longer kept: its answer has come")

func (rw *rewind) get() (io.ReadCloser, error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.disarmed {
		return nil, errRewound
	}
	return rw.held.attempt(rw.body), nil
}

// disarm lets go of the bytes; a later GetBody fails.
func (rw *rewind) disarm() {
	rw.mu.Lock()
	rw.body, rw.disarmed = nil, true
	rw.mu.Unlock()
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
func (x *exchange) forward(c *route.Candidate, began time.Time, ans *answer) attempt {
	g, w, r, out := x.g, x.w, x.r, &x.out
	transport, err := g.upstreams.transport(c)
	if err != nil {
		g.log.Warn("no transport for upstream", "site", c.Site, "err", err)
		return notSent
	}
	tw := &trackingWriter{ResponseWriter: w}
	// A stream ends with the terminal event when a drain runs out of time
	// while it is copied here (InterruptStreams); once detached
	// (detach.go), its stream set ends it so. An answer that may be
	// detached outlives this handler, and so must its upstream request:
	// its context is the client's without the client's end, cancelled
	// when the client leaves while the handler runs, and by the detached
	// stream after. Only a request that asks for a stream pays for these
	// contexts.
	outCtx := r.Context()
	var via *rejoinListener
	var detachAfter time.Duration
	if limits := &g.cfg.Load().Limits; out.stream && limits.Detach() {
		via, detachAfter = detachVia(r), limits.DetachDelay()
	}
	var cancelOut context.CancelFunc
	stopDrain, stopWatch := func() bool { return false }, func() bool { return false }
	if out.stream {
		base := outCtx
		if via != nil {
			base = context.WithoutCancel(outCtx)
		}
		ctx, cancel := context.WithCancelCause(base)
		outCtx, cancelOut = ctx, func() { cancel(nil) }
		stopDrain = context.AfterFunc(g.stopping, func() { cancel(errShutdown) })
		if via != nil {
			stopWatch = context.AfterFunc(r.Context(), cancelOut)
		}
		defer func() {
			if ans.detached == nil && x.tail == nil {
				stopDrain()
				stopWatch()
				cancelOut()
			}
		}()
	}
	// handoff is the answer's body while its stream waits to be detached;
	// the wait ends with this attempt, however it ends (the proxy panics
	// when the client leaves mid-copy).
	var handoff *detachingBody
	defer func() {
		if handoff != nil {
			g.streams.waited()
		}
	}()
	req := upstreamRequest(outCtx, r, c.Upstream, x.peer != nil)
	if ans.bound && !c.Local {
		req.Header.Set(headerBoundProvider, c.Provider)
	}
	rw := out.setBody(req)
	resp, err := transport.RoundTrip(req)
	rw.disarm()
	if err == nil && !c.Local && resp.Header.Get(headerNotDelivered) != "" {
		resp.Body.Close()
		err = errNotDelivered
	}
	if err != nil {
		return x.attemptFailed(tw, c, ans, outCtx, err, began)
	}
	// Answered: nothing sends the request again, and a stream that goes
	// on keeps its answer, not the request (its header, its URL).
	out.letGo()
	resp.Request = nil
	dropHopHeaders(resp.Header)
	g.health.answered(c, resp.StatusCode, began)
	ans.stream = strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	resp.Header.Set(headerSite, c.Site)
	if c.Local || resp.Header.Get(headerBackend) == "" {
		resp.Header.Set(headerBackend, c.Provider)
	}
	ans.provider = resp.Header.Get(headerBackend)
	// Bound now, before the answer reaches the client: bound after it, a
	// session's next turn could arrive first and be drawn anew (two of
	// twelve sessions began on the peer site and went on at this one).
	g.bind(x.sess, x.attempt, affinity.Binding{Site: c.Site, Provider: ans.provider})
	// A stream the upstream cuts is a failure of the upstream, seen only
	// while the body is copied; its first byte is the time to first token
	// the dashboard shows (upstreamWatch).
	resp.Body = &watchedBody{ReadCloser: resp.Body, ctx: outCtx,
		watch: &upstreamWatch{g: g, c: c, began: began, ans: ans, cost: x.cost},
		sse:   out.stream && ans.stream && resp.StatusCode == http.StatusOK}
	if hr := hopOf(r.Context()); hr != nil && out.stream && ans.stream && detachable(resp) {
		// A peer's event stream: its head goes now, its body from the
		// top of the hop handler, once this handler's frames are gone.
		relayHead(tw, resp, true)
		resp.Header = nil // written; the answer's trailers are all the tail reads of it
		x.tail = &streamTail{w: tw, resp: resp, ans: ans, finish: func() { stopDrain(); stopWatch(); cancelOut() }}
		hr.tail = x.tail
		return delivered
	}
	if via != nil && ans.stream && detachable(resp) {
		handoff = &detachingBody{body: resp.Body, resp: resp, clk: g.clk, after: g.clk.Now().Add(g.streams.waitToDetach(detachAfter))}
		resp.Body = handoff
	}
	relayAnswer(tw, resp, ans.stream)
	if handoff == nil || !handoff.handedOff {
		return delivered
	}
	// The stream has run for detachAfter: the proxy wrote its head and
	// its events so far, and left the rest of the body to be detached.
	if s := handoff.detach(tw, g.streams, via, outCtx, cancelOut); s != nil {
		// The stream set ends it at a drain, and the client's leaving
		// is seen when a write to it fails: the handler's end, which
		// cancels r's context, must not end it.
		stopDrain()
		stopWatch()
		ans.detached = s
		return delivered
	}
	copyAttached(tw, handoff.body)
	return delivered
}

// attemptFailed answers an attempt whose upstream gave no answer (err),
// unless the client has left (ctx, the upstream request's, is done), and
// says whether the request may go elsewhere.
func (x *exchange) attemptFailed(tw *trackingWriter, c *route.Candidate, ans *answer, ctx context.Context, err error, began time.Time) attempt {
	g := x.g
	if g.stopping.Err() != nil && x.r.Context().Err() == nil && !tw.wrote {
		// A drain past its deadline cancelled the request before any
		// answer: the client is told to retry, and the upstream is not
		// blamed.
		errShuttingDown.write(tw, g.turn.Load())
		return failed
	}
	if ctx.Err() != nil {
		return delivered // the client went away; nothing to answer or count
	}
	kind := classifyUpstream(err)
	ans.failure = kind
	g.upstreamFailed(c, kind, err, began)
	if kind.nothingSent() && !tw.wrote {
		return notSent
	}
	if !tw.wrote {
		errUpstreamFailed.write(tw, 0)
	}
	return failed
}

// copyAttached copies the rest of a stream the server would not give up
// (detach), as relayAnswer does: each read written and flushed at once.
// A failed write is the client gone, a failed read the upstream's cut
// (watchedBody has told the client): either way the stream just ends.
func copyAttached(w http.ResponseWriter, body io.ReadCloser) {
	defer body.Close()
	buf := streamBuffers.Get().(*[]byte)
	defer streamBuffers.Put(buf)
	copyBody(w, body, *buf, true)
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
	upstreamLost           upstreamFailure = "connection_lost" // the connection died before any answer (a hop connection went silent)
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
	case errors.Is(err, h1client.ErrResponseHeaderTimeout), strings.Contains(msg, "timeout awaiting response headers"):
		return upstreamResponse
	case errors.Is(err, errHopSilent), errors.Is(err, h1client.ErrConnectionLost), strings.Contains(msg, "connection lost"):
		return upstreamLost
	}
	return upstreamTransport
}

// upstreamFailed counts a failure and tells passive health.
func (g *Gateway) upstreamFailed(c *route.Candidate, kind upstreamFailure, err error, began time.Time) {
	g.m.upstreamErrors.WithLabelValues(c.Site, string(kind)).Inc()
	g.log.Debug("upstream failure", "site", c.Site, "provider", c.Provider, "reason", kind, "err", err)
	if kind.nothingSent() {
		g.health.failed(c, began)
		return
	}
	g.health.answered(c, http.StatusBadGateway, began)
}

// bodyWatcher is told what a watchedBody sees of an upstream's answer.
type bodyWatcher interface {
	firstByte()        // the answer's first byte was read
	failed(err error)  // the first error reading it, other than its end or the client's leaving
	ended(e streamEnd) // an event stream ended early, by reason
}

// upstreamWatch is what an attempt's answer tells the gateway as it is
// copied: its first byte to the dashboard and, for a remote site's
// stream, to the judgement of the site's claims; a failure to passive
// health; a stream's early end to its counter. It holds what the hooks
// need and never the exchange, whose writer and request hold the server
// connection's buffers, since a detached stream keeps its body as long
// as it runs (TestDetachedStreamLetsGoOfItsHandler). One value, not three
// closures: an allocation per request, not four.
type upstreamWatch struct {
	g     *Gateway
	c     *route.Candidate
	began time.Time
	ans   *answer
	cost  route.Cost
}

func (u *upstreamWatch) firstByte() {
	u.ans.firstByte = u.g.clk.Now()
	u.g.hist.firstByte(u.c.Site, u.ans.firstByte.Sub(u.began))
	if u.ans.stream && u.ans.served != nil {
		u.g.judgeStream(u.c.Site, u.ans.served, u.ans.firstByte.Sub(u.began), u.cost)
	}
}

func (u *upstreamWatch) failed(err error) {
	u.ans.failure = upstreamStream
	u.g.upstreamFailed(u.c, upstreamStream, err, u.began)
}

func (u *upstreamWatch) ended(e streamEnd) {
	u.g.m.streamsEndedEarly.WithLabelValues(u.c.Site, string(e)).Inc()
}

// watchedBody reports the first error reading an upstream's answer, other
// than its end or the client's leaving. For an event stream the client
// asked for (sse), it also makes sure the client can tell a cut answer
// from a whole one: a stream that ends before its `data: [DONE]`, cut by
// the upstream or closed early, ends instead with the terminal error
// event (streamEnd), then the end of the answer, and is counted by
// reason. Its fields are the copying goroutine's (the handler's, or the
// detached stream's).
type watchedBody struct {
	io.ReadCloser
	ctx   context.Context
	watch bodyWatcher
	once  sync.Once
	read  bool // a byte was read

	sse bool
	// tail holds the stream's last bytes, to see its [DONE].
	tail [32]byte
	tn   int
	// rest is what is left to give of the terminal event; done once it
	// has all been given.
	rest []byte
	done bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	if b.rest != nil || b.done {
		return b.giveRest(p, 0)
	}
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.read {
		b.read = true
		b.watch.firstByte()
	}
	if err != nil && err != io.EOF && b.ctx.Err() == nil {
		b.once.Do(func() { b.watch.failed(err) })
	}
	if !b.sse {
		return n, err
	}
	b.keepTail(p[:n])
	shutdown := b.ctx.Err() != nil && context.Cause(b.ctx) == errShutdown
	if err == nil || (b.ctx.Err() != nil && !shutdown) || b.sawDone() {
		return n, err // streaming, whole, or the client is gone
	}
	reason := streamCut
	switch {
	case shutdown:
		reason = streamShutdown
	case err == io.EOF:
		reason = streamEndedEarly
	}
	b.watch.ended(reason)
	b.rest = reason.event(!b.endsEvent())
	return b.giveRest(p, n)
}

// interrupt is the terminal event of a stream the gateway itself ends
// before its [DONE] (a drain past its deadline), counted; nil when the
// answer is not an event stream or has ended already. The goroutine that
// reads the body only.
func (b *watchedBody) interrupt(reason streamEnd) []byte {
	if !b.sse || b.done || b.sawDone() {
		return nil
	}
	b.done = true
	b.watch.ended(reason)
	return reason.event(!b.endsEvent())
}

// giveRest copies what it can of the terminal event after the n bytes
// already in p; the stream ends once all of it is given.
func (b *watchedBody) giveRest(p []byte, n int) (int, error) {
	c := copy(p[n:], b.rest)
	b.rest = b.rest[c:]
	if len(b.rest) == 0 {
		b.rest, b.done = nil, true
		return n + c, io.EOF
	}
	return n + c, nil
}

func (b *watchedBody) keepTail(p []byte) {
	if len(p) >= len(b.tail) {
		b.tn = copy(b.tail[:], p[len(p)-len(b.tail):])
		return
	}
	if keep := len(b.tail) - len(p); b.tn > keep {
		copy(b.tail[:], b.tail[b.tn-keep:b.tn])
		b.tn = keep
	}
	b.tn += copy(b.tail[b.tn:], p)
}

// sawDone reports whether the stream's last event is `data: [DONE]`, or
// the terminal error event (a peer gateway's, over the hop: one is
// enough).
func (b *watchedBody) sawDone() bool {
	t := bytes.TrimRight(b.tail[:b.tn], "\r\n")
	return bytes.HasSuffix(t, []byte("data: [DONE]")) || bytes.HasSuffix(t, []byte(`"code":"`+terminalCode+`"}}`))
}

// endsEvent reports whether what was given ends an event (a blank line),
// or nothing was given.
func (b *watchedBody) endsEvent() bool {
	t := b.tail[:b.tn]
	return len(t) == 0 || bytes.HasSuffix(t, []byte("\n\n")) || bytes.HasSuffix(t, []byte("\r\n\r\n"))
}

// streamEnd is why an event stream ended before its [DONE], the reason
// label of grid_gateway_streams_ended_early_total.
type streamEnd string

const (
	// streamCut: the upstream's connection broke mid-answer.
	streamCut streamEnd = "upstream_cut"
	// streamEndedEarly: the upstream ended the answer cleanly, but before
	// its [DONE] (an engine shutting down, say).
	streamEndedEarly streamEnd = "upstream_ended"
	// streamShutdown: the gateway's drain ran out of time with the stream
	// still going (SIGTERM, drain-timeout).
	streamShutdown streamEnd = "gateway_shutdown"
)

var streamEnds = []streamEnd{streamCut, streamEndedEarly, streamShutdown}

// terminalCode is the terminal error event's code.
const terminalCode = "stream_interrupted"

// event is the terminal error event in the OpenAI shape, which the OpenAI
// SDKs raise as an APIError: a data line holding an error object, after a
// blank line when the answer stopped mid-event (so the partial event ends
// first), and no [DONE] after it: the answer is not complete.
func (e streamEnd) event(closeEvent bool) []byte {
	msg := "the upstream's connection broke before the answer was complete"
	switch e {
	case streamEndedEarly:
		msg = "the upstream ended the answer before it was complete (no [DONE])"
	case streamShutdown:
		msg = "the gateway shut down before the answer was complete (its drain timed out)"
	}
	b, _ := json.Marshal(msg)
	ev := `data: {"error":{"message":` + string(b) + `,"type":"server_error","code":"` + terminalCode + `"}}` + "\n\n"
	if closeEvent {
		ev = "\n\n" + ev
	}
	return []byte(ev)
}

// trackingWriter notes whether anything reached the client; the handler's
// goroutine only.
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

// The copy buffer of an answer (relayAnswer), pooled: a stream's small,
// because an SSE stream holds it, mostly idle, for as long as the model
// generates, and its events are a few hundred bytes; any other answer's
// large, to copy a big body in few reads.
const (
	streamBufferSize = 2 << 10
	bulkBufferSize   = 32 << 10
)

var (
	streamBuffers = sync.Pool{New: func() any { b := make([]byte, streamBufferSize); return &b }}
	bulkBuffers   = sync.Pool{New: func() any { b := make([]byte, bulkBufferSize); return &b }}
)
