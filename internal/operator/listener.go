package operator

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grid-inference/grid/internal/connlimit"
	"github.com/grid-inference/grid/internal/identity"
)

// Limits of the signals listener (docs/protocol.md §2.1).
type Limits struct {
	// MaxConns bounds open connections; ReservedLocal of them only the
	// site's own gateway may hold.
	MaxConns      int
	ReservedLocal int
	// HandshakesPerSource bounds TLS handshakes in progress per source IP
	// (per /64 for IPv6); HandshakesPer48 bounds them per /48 of
	// global-unicast IPv6, so a host cannot spread a flood over its /64s.
	HandshakesPerSource, HandshakesPer48 int
	// PerPeer bounds one peer site's authenticated connections.
	PerPeer int
	// Handshake bounds the TLS handshake; HeaderRead bounds reading a
	// request's headers, keep-alive idle included; WriteStall bounds a write
	// that makes no progress.
	Handshake, HeaderRead, WriteStall time.Duration
	// MaxConnAge closes a connection gracefully, after the answer in
	// progress, once it is this old: a long-lived client is rebalanced and
	// picks up a renewed server certificate.
	MaxConnAge time.Duration
	// MaxWait bounds a long poll's wait. Zero turns long polls off: answers
	// carry no cursor, so callers fall back to polling at their intervals,
	// as they do against an operator that predates the long poll.
	MaxWait time.Duration
}

// DefaultLimits are the reference's.
var DefaultLimits = Limits{
	MaxConns: 256, ReservedLocal: 8, HandshakesPerSource: 8, HandshakesPer48: 32, PerPeer: 8,
	Handshake: 3 * time.Second, HeaderRead: 10 * time.Second, WriteStall: 10 * time.Second,
	MaxConnAge: 300 * time.Second, MaxWait: MaxWait,
}

// guardedListener accepts TCP connections, completes their TLS handshakes
// under the limits, and hands authenticated connections to an http.Server.
// Sheds are counted by the limit that shed them.
type guardedListener struct {
	raw    net.Listener
	conf   *tls.Config
	id     *identity.Source
	isPeer func(string) bool
	lim    Limits
	shed   *prometheus.CounterVec
	// accepted counts connections taken in for a handshake.
	accepted prometheus.Counter
	log      *slog.Logger

	ready chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup

	mu          sync.Mutex
	total       int                  // every open connection, handshaking or not
	nonLocal    int                  // authenticated connections not of Local
	handshaking map[netip.Prefix]int // source group -> handshakes in progress
	perPeer     map[string]int
	release     map[net.Conn]func()
}

func newGuardedListener(raw net.Listener, id *identity.Source, isPeer func(string) bool, lim Limits, shed *prometheus.CounterVec, accepted prometheus.Counter, log *slog.Logger) *guardedListener {
	l := &guardedListener{
		raw: raw, conf: id.ServerTLS(), id: id, isPeer: isPeer, lim: lim, shed: shed, accepted: accepted, log: log,
		ready: make(chan net.Conn), done: make(chan struct{}),
		handshaking: map[netip.Prefix]int{}, perPeer: map[string]int{}, release: map[net.Conn]func(){},
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *guardedListener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.raw.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(100 * time.Millisecond) // an accept error pauses, not spins
			continue
		}
		src := connlimit.SourceKeys(c.RemoteAddr())
		l.mu.Lock()
		switch {
		case l.total >= l.lim.MaxConns:
			l.mu.Unlock()
			l.shedConn(c, "total")
			continue
		case l.handshaking[src.Source] >= l.lim.HandshakesPerSource,
			src.Wide.IsValid() && l.handshaking[src.Wide] >= l.lim.HandshakesPer48:
			l.mu.Unlock()
			l.shedConn(c, "source")
			continue
		}
		l.total++
		l.accepted.Inc()
		l.handshaking[src.Source]++
		if src.Wide.IsValid() {
			l.handshaking[src.Wide]++
		}
		l.mu.Unlock()
		l.wg.Add(1)
		go l.handshake(c, src)
	}
}

func (l *guardedListener) shedConn(c net.Conn, limit string) {
	l.shed.WithLabelValues(limit).Inc()
	c.Close()
}

// handshake completes TLS within its bound, then admits the connection by
// caller class: Local always (it has its reserve); others within the
// non-Local share; a peer site within its own cap, or one 503 and close.
func (l *guardedListener) handshake(raw net.Conn, src connlimit.Keys) {
	defer l.wg.Done()
	tc := tls.Server(&stallConn{Conn: raw, stall: l.lim.WriteStall}, l.conf)
	ctx, cancel := context.WithTimeout(context.Background(), l.lim.Handshake)
	err := tc.HandshakeContext(ctx)
	cancel()
	l.mu.Lock()
	l.handshakeDone(src.Source)
	if src.Wide.IsValid() {
		l.handshakeDone(src.Wide)
	}
	if err != nil {
		l.total--
		l.mu.Unlock()
		tc.Close()
		return
	}
	cs := tc.ConnectionState()
	caller := l.id.Classify(&cs)
	if caller.Class != identity.Local {
		if l.nonLocal >= l.lim.MaxConns-l.lim.ReservedLocal {
			l.total--
			l.mu.Unlock()
			l.shedConn(tc, "total")
			return
		}
		if caller.Class == identity.Peer && l.isPeer(caller.Site) && l.perPeer[caller.Site] >= l.lim.PerPeer {
			l.total--
			l.mu.Unlock()
			l.shed.WithLabelValues("peer").Inc()
			// Read the request first (bounded), so the client sees the
			// answer rather than a connection closed under its request.
			tc.SetDeadline(time.Now().Add(time.Second))
			if req, err := http.ReadRequest(bufio.NewReaderSize(io.LimitReader(tc, 16<<10), 4<<10)); err == nil {
				req.Body.Close()
			}
			io.WriteString(tc, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 42\r\nConnection: close\r\n\r\nsignals: too many connections from a site\n")
			tc.Close()
			return
		}
		l.nonLocal++
		if caller.Class == identity.Peer {
			l.perPeer[caller.Site]++
		}
	}
	var once sync.Once
	l.release[tc] = func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.total--
			if caller.Class != identity.Local {
				l.nonLocal--
			}
			if caller.Class == identity.Peer {
				if l.perPeer[caller.Site]--; l.perPeer[caller.Site] <= 0 {
					delete(l.perPeer, caller.Site)
				}
			}
			delete(l.release, tc)
		})
	}
	l.mu.Unlock()
	select {
	case l.ready <- tc:
	case <-l.done:
		l.connClosed(tc)
		tc.Close()
	}
}

// connClosed releases a connection's share of the limits; http.Server calls
// it through ConnState when the connection ends.
func (l *guardedListener) connClosed(c net.Conn) {
	l.mu.Lock()
	rel := l.release[c]
	l.mu.Unlock()
	if rel != nil {
		rel()
	}
}

func (l *guardedListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guardedListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.raw.Close()
	})
	return err
}

// wait returns once the accept loop and every handshake have ended.
func (l *guardedListener) wait() { l.wg.Wait() }

func (l *guardedListener) Addr() net.Addr { return l.raw.Addr() }

func (l *guardedListener) handshakeDone(k netip.Prefix) {
	if l.handshaking[k]--; l.handshaking[k] <= 0 {
		delete(l.handshaking, k)
	}
}

// stallConn sets a fresh write deadline before every write, so a peer that
// stops reading fails a write after the stall bound rather than pinning a
// goroutine forever.
type stallConn struct {
	net.Conn
	stall time.Duration
}

func (c *stallConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.stall))
	return c.Conn.Write(b)
}

// connBornKey holds, in a connection's context, when it was accepted.
type connBornKey struct{}

// closeWhenOld answers with Connection: close on a connection older than
// maxAge, so it ends gracefully after this answer.
func closeWhenOld(next http.Handler, maxAge time.Duration) http.Handler {
	if maxAge <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if born, ok := r.Context().Value(connBornKey{}).(time.Time); ok && time.Since(born) >= maxAge {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// ServeSignals serves the signals endpoint on ln until ctx ends, then shuts
// down within drain.
func (o *Operator) ServeSignals(ctx context.Context, ln net.Listener, lim Limits, drain time.Duration) error {
	if o.id == nil {
		return errors.New("no identity: the signals listener is mTLS only")
	}
	gl := newGuardedListener(ln, o.id, o.isPeer, lim, o.m.peers.shed, o.m.peers.accepted, o.log)
	srv := &http.Server{
		Handler: closeWhenOld(o.signalsHandler(lim.MaxWait), lim.MaxConnAge),
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connBornKey{}, time.Now())
		},
		ReadHeaderTimeout: lim.HeaderRead,
		IdleTimeout:       lim.HeaderRead,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(o.log.Handler(), slog.LevelDebug),
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				gl.connClosed(c)
			}
		},
	}
	bellCtx, stopBell := context.WithCancel(ctx)
	defer stopBell()
	bellDone := make(chan struct{})
	go func() { defer close(bellDone); o.waits.ring(bellCtx, o.clk) }()
	defer func() { stopBell(); <-bellDone }()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(gl) }()
	select {
	case err := <-errc:
		o.waits.stop()
		gl.Close()
		gl.wait()
		return fmt.Errorf("signals listener: %w", err)
	case <-ctx.Done():
	}
	// Long polls end now, so the drain is not held by them.
	o.waits.stop()
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	gl.Close()
	gl.wait()
	<-errc
	return nil
}
