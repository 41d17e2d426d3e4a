package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"log"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/connlimit"
	"github.com/grid-inference/grid/internal/identity"
	"golang.org/x/sys/unix"
)

// The gateway's listeners: which exist, the connection caps that guard
// them, and the HTTP server each is served by.

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

// Listen binds addr for a listener; with reusePort (config key
// `reusePort`), with SO_REUSEPORT, so that a gateway started on the same
// addresses shares them: the kernel spreads new connections over every
// process bound, and once the old one closes its listener at SIGTERM the
// new one takes them all while the old drains.
func Listen(ctx context.Context, addr string, reusePort bool) (net.Listener, error) {
	var lc net.ListenConfig
	if reusePort {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var sockErr error
			if err := c.Control(func(fd uintptr) {
				sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}); err != nil {
				return err
			}
			if sockErr != nil {
				return fmt.Errorf("SO_REUSEPORT: %w", sockErr)
			}
			return nil
		}
	}
	return lc.Listen(ctx, "tcp", addr)
}

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
// the connections it sheds, and serves TLS on it when conf is not nil. The
// limits follow reloads (Reload). The client listener also takes back the
// connections of detached streams (detach.go), which its server then
// serves again.
//
// The layers have one order, and only Guard builds them: the caps at
// accept, before a handshake can cost anything; then TLS; then the way
// back in. A connection a detached stream hands back has done its
// handshake, and a TLS listener wrapped around the rejoining one would
// handshake it again: a kept-alive client's next request got 400.
func (g *Gateway) Guard(listener Listener, ln net.Listener, conf *tls.Config) net.Listener {
	shed, name := g.m.connsShed, listener.String()
	gl := connlimit.New(ln, connLimits(listener, g.cfg.Load().Limits), func(limit string) { shed.WithLabelValues(name, limit).Inc() })
	g.guards[listener].Store(gl)
	var out net.Listener = gl
	if conf != nil {
		out = tls.NewListener(gl, conf)
	}
	if listener == ClientListener {
		rj := newRejoinListener(out, g.cfg.Load().Limits.ClientIdleTimeout.D())
		g.rejoin.Store(rj)
		return rj
	}
	return out
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
