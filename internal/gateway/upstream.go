package gateway

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/h1client"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/route"
)

// Keep-alive of the upstream pools.
const (
	idleConnTimeout = 90 * time.Second
	// hopPingAfter is how long a peer gateway's connection may carry no
	// frame before net/http pings it; the peer's HTTP/2 stack answers
	// whatever its handlers are doing, so a slow model never looks
	// silent. Whether the peer is dead is hopWatch's verdict (hoplive.go).
	hopPingAfter = 300 * time.Millisecond
)

// upstreams holds the keep-alive connection pools: this site's providers'
// (localTransport), one HTTP/2 mTLS transport per remote site's gateway.
type upstreams struct {
	id     *identity.Source
	limits config.Upstream
	local  *localTransport
	hop    *hopWatch
	mu     sync.Mutex
	remote map[string]*http.Transport
}

func newUpstreams(id *identity.Source, limits config.Upstream, log *slog.Logger) *upstreams {
	return &upstreams{id: id, limits: limits, local: &localTransport{plain: newLocalTransport(limits), tls: newTransport(limits)}, hop: newHopWatch(log), remote: map[string]*http.Transport{}}
}

// newTransport is a pool bounded by limits: connecting (TLS included) by
// the connect timeout, the wait for response headers by its own; a stream
// runs as long as it streams.
func newTransport(limits config.Upstream) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           dialUpstream(limits),
		TLSHandshakeTimeout:   limits.ConnectTimeout.D(),
		ResponseHeaderTimeout: limits.ResponseHeaderTimeout.D(),
		IdleConnTimeout:       idleConnTimeout,
		MaxIdleConnsPerHost:   256,
		ForceAttemptHTTP2:     false,
		// Each connection holds its buffers for as long as it lives, a
		// stream's for the whole stream: small ones. A request body larger
		// than the write buffer is written straight through (headers
		// longer than it take a second write); an answer is copied out in
		// the proxy's own buffer, or the detached stream's.
		WriteBufferSize: 512,
		ReadBufferSize:  1 << 10,
	}
}

// dialUpstream opens an upstream's TCP connection within the connect
// timeout, for either kind of pool.
func dialUpstream(limits config.Upstream) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{Timeout: limits.ConnectTimeout.D(), KeepAlive: 30 * time.Second}).DialContext
}

// newLocalTransport is the pool of this site's plain-HTTP providers
// (h1client: no goroutine per connection, a request in one write), bounded
// as newTransport's.
func newLocalTransport(limits config.Upstream) *h1client.Transport {
	return &h1client.Transport{
		DialContext:           dialUpstream(limits),
		ResponseHeaderTimeout: limits.ResponseHeaderTimeout.D(),
		IdleConnTimeout:       idleConnTimeout,
		MaxIdleConnsPerHost:   256,
		// A stream's connection holds it for the whole stream; an answer
		// is copied out in the proxy's own buffer, or the detached
		// stream's.
		ReadBufferSize: 1 << 10,
	}
}

// localTransport is this site's providers' pool: plain HTTP by h1client,
// https (a provider behind TLS) by net/http's transport.
type localTransport struct {
	plain *h1client.Transport
	tls   *http.Transport
}

func (l localTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" {
		return l.plain.RoundTrip(req)
	}
	return l.tls.RoundTrip(req)
}

// transport returns the pool for a candidate: a remote site's gateway is
// dialled with this site's identity, must present exactly that site's, and
// is spoken to over HTTP/2, its connections watched for silence.
func (u *upstreams) transport(c *route.Candidate) (http.RoundTripper, error) {
	if c.Local {
		return u.local, nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if t := u.remote[c.Site]; t != nil {
		return t, nil
	}
	conf, err := u.id.ClientTLS(c.Site)
	if err != nil {
		return nil, err
	}
	t := newTransport(u.limits)
	t.DialTLSContext = u.hop.dialer(t.DialContext, conf, u.limits.ConnectTimeout.D())
	t.ForceAttemptHTTP2 = true
	t.HTTP2 = &http.HTTP2Config{SendPingTimeout: hopPingAfter, PingTimeout: hopPingBackstop}
	u.remote[c.Site] = t
	return t, nil
}

func (u *upstreams) close() {
	u.local.plain.CloseIdleConnections()
	u.local.tls.CloseIdleConnections()
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, t := range u.remote {
		t.CloseIdleConnections()
	}
}

// health is passive upstream health, in the manner of Envoy's outlier
// detection: a candidate whose upstream refused a connection, or answered
// 5xx five times in a row, is ejected for a while, doubling while it keeps
// failing, and is demoted in the next snapshot; an answer below 500 clears
// it.
type health struct {
	clk     clock.Clock
	ejected func(reason string)
	mu      sync.Mutex
	bad     map[string]*downState
}

type downState struct {
	until     time.Time
	ejectedAt time.Time     // the latest ejection
	backoff   time.Duration // zero until the first ejection
	errors    int           // consecutive failed answers
}

const (
	minDown = 2 * time.Second
	maxDown = 30 * time.Second
	// ejectAfter5xx is how many 5xx answers in a row eject an upstream.
	ejectAfter5xx = 5
)

// Ejection reasons, the values of the counter's reason label.
const (
	ejectRefused = "refused"
	eject5xx     = "5xx"
)

func newHealth(clk clock.Clock, ejected func(reason string)) *health {
	return &health{clk: clk, ejected: ejected, bad: map[string]*downState{}}
}

func healthKey(c *route.Candidate) string {
	if c.Local {
		return c.Site + "/" + c.Provider
	}
	return c.Site // a remote site's gateway is one upstream
}

func (h *health) state(c *route.Candidate) *downState {
	s := h.bad[healthKey(c)]
	if s == nil {
		s = &downState{}
		h.bad[healthKey(c)] = s
	}
	return s
}

func (h *health) eject(s *downState, reason string) {
	s.backoff = min(max(2*s.backoff, minDown), maxDown)
	s.ejectedAt = h.clk.Now()
	s.until = s.ejectedAt.Add(s.backoff)
	s.errors = 0
	if h.ejected != nil {
		h.ejected(reason)
	}
}

// failed notes an attempt begun at began that reached nothing (a refused
// connection, an answer handed back undelivered): the upstream is
// ejected at once. An attempt begun before the upstream's latest ejection
// belongs to it: eight requests refused together by a peer gateway that
// had not read its operator yet doubled the down period eight times, and
// the site stayed out for minutes after it had mended.
func (h *health) failed(c *route.Candidate, began time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state(c)
	if began.Before(s.ejectedAt) {
		return
	}
	h.eject(s, ejectRefused)
}

// answered notes the answer status of a request sent at began. A failure
// of a request sent before the upstream's latest ejection belongs to the
// streak that ejected it, already counted: under concurrency it must not
// start the next streak, or an upstream would be ejected again after fewer
// than five fresh failures.
func (h *health) answered(c *route.Candidate, status int, began time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if status < 500 {
		delete(h.bad, healthKey(c))
		return
	}
	s := h.state(c)
	if began.Before(s.ejectedAt) {
		return
	}
	if s.errors++; s.errors >= ejectAfter5xx {
		h.eject(s, eject5xx)
	}
}

// isDown reports a candidate still inside its down period.
func (h *health) isDown(c *route.Candidate) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.bad[healthKey(c)]
	return s != nil && h.clk.Now().Before(s.until)
}
