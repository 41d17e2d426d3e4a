package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The hop's liveness check (docs/gateway.md, the hop speaks HTTP/2).
//
// net/http pings a peer gateway's HTTP/2 connection that carried no frame
// for hopPingAfter, and the peer's HTTP/2 stack answers whatever its
// handlers are doing; so a healthy peer is never silent for much longer
// than hopPingAfter plus a round trip. But net/http's own verdict, "no
// answer within the ping timeout closes the connection", cannot tell a dead
// peer from this process having been starved of CPU: after a stall, the
// ping's timer and the answer waiting in the socket become ready together,
// and the timer may win. That closed healthy connections and cut every
// stream on them (up to 250), and the lost connection ejected the peer
// site for seconds.
//
// So the verdict is the gateway's own. Each hop connection counts the reads
// that brought bytes; hopWatch looks every hopWatchEvery and adds the time
// since its last look, but never more than two looks' worth, to the
// connection's silence: a stall of this process counts as a moment, not as
// the peer's silence. A connection silent for hopSilenceLimit is closed,
// and its requests that had no answer yet go elsewhere (connection_lost).
// net/http's ping timeout stays, far behind, for a gateway whose watch is
// not running.
const (
	hopWatchEvery = 100 * time.Millisecond
	// hopSilenceLimit leaves a ping 2 s to come back (a long round trip, a
	// peer starved of CPU for a moment) and finds a stopped peer within
	// 2.3 s of its last byte, inside the 3 s the SIGSTOP row allows.
	hopSilenceLimit = hopPingAfter + 2*time.Second
	hopPingBackstop = 10 * time.Second
)

// errHopSilent is the read error of a connection the watch closed,
// classified connection_lost (classifyUpstream).
var errHopSilent = fmt.Errorf("hop connection lost: the peer sent nothing for %v", hopSilenceLimit)

// hopWatch holds the hop's live HTTP/2 connections. Its run loop is the
// only reader and writer of last and of each connection's seen and silent
// fields (under mu, which guards conns).
type hopWatch struct {
	log   *slog.Logger
	mu    sync.Mutex
	conns map[*hopConn]struct{}
	last  time.Time // the latest look
}

func newHopWatch(log *slog.Logger) *hopWatch {
	return &hopWatch{log: log, conns: map[*hopConn]struct{}{}}
}

// hopConn is a hop connection's TCP connection, under its TLS.
type hopConn struct {
	net.Conn
	watch *hopWatch
	reads atomic.Uint64 // reads that returned bytes
	lost  atomic.Bool   // closed by the watch

	seen   uint64        // reads at the watch's last look
	silent time.Duration // awake time since reads last moved
}

func (c *hopConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.reads.Add(1)
	}
	if err != nil && c.lost.Load() {
		err = errHopSilent
	}
	return n, err
}

func (c *hopConn) Close() error {
	c.watch.mu.Lock()
	delete(c.watch.conns, c)
	c.watch.mu.Unlock()
	return c.Conn.Close()
}

// dialer returns the hop transport's DialTLSContext: a TCP connection by
// dial (the pool's own, bounded by the connect timeout), its TLS handshake
// (conf, offering HTTP/2) within the connect timeout again, and the
// connection watched when it speaks HTTP/2 (an HTTP/1.1 connection is not
// pinged, so its silence means nothing).
func (w *hopWatch) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error), conf *tls.Config, connectTimeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hc := &hopConn{Conn: raw, watch: w}
		cfg := conf.Clone()
		cfg.NextProtos = []string{"h2", "http/1.1"}
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(hc, cfg)
		hctx, cancel := context.WithTimeout(ctx, connectTimeout)
		defer cancel()
		if err := tc.HandshakeContext(hctx); err != nil {
			raw.Close()
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return nil, fmt.Errorf("hop %s: TLS handshake timeout: %w", addr, err)
			}
			return nil, err
		}
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			w.mu.Lock()
			w.conns[hc] = struct{}{}
			w.mu.Unlock()
		}
		return tc, nil
	}
}

// run watches the hop's connections until ctx ends. Gateway.Run owns it.
func (w *hopWatch) run(ctx context.Context) {
	tick := time.NewTicker(hopWatchEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			w.look(now)
		}
	}
}

// look adds the time since the last look, but never more than two looks'
// worth, to the silence of every connection that read nothing since then,
// and closes those silent for hopSilenceLimit.
func (w *hopWatch) look(now time.Time) {
	var awake time.Duration
	if !w.last.IsZero() {
		awake = min(now.Sub(w.last), 2*hopWatchEvery)
	}
	w.last = now
	var lost []*hopConn
	w.mu.Lock()
	for c := range w.conns {
		if r := c.reads.Load(); r != c.seen {
			c.seen, c.silent = r, 0
			continue
		}
		if c.silent += awake; c.silent >= hopSilenceLimit {
			lost = append(lost, c)
		}
	}
	w.mu.Unlock()
	for _, c := range lost {
		w.log.Warn("hop connection silent; closing it, its unanswered requests go elsewhere",
			"peer", c.RemoteAddr().String(), "silent", c.silent)
		c.lost.Store(true)
		c.Close()
	}
}
