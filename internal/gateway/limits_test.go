package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/sim"
)

// serveGuarded serves the client API of g on a guarded loopback listener
// with the given limits and returns its address.
func serveGuarded(t testing.TB, g *Gateway, listener Listener, set func(*config.GatewayLimits)) string {
	t.Helper()
	c := *g.cfg.Load()
	set(&c.Limits)
	g.cfg.Store(&c)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := g.Server(ClientListener, nil)
	done := make(chan struct{})
	go func() { srv.Serve(g.Guard(listener, raw, nil)); close(done) }()
	t.Cleanup(func() {
		// Shutdown, unlike Close, waits for every connection's goroutine.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	return raw.Addr().String()
}

func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// modelsOn sends GET /v1/models on c and reports the status, or 0 when the
// server closed the connection without an answer.
func modelsOn(c net.Conn) int {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: grid\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func shedTotal(g *Gateway, listener, limit string) float64 {
	return testutil.ToFloat64(g.m.connsShed.WithLabelValues(listener, limit))
}

func TestClientConnectionCaps(t *testing.T) {
	g := gatewayWithEastPool(t)
	defer g.Close()
	addr := serveGuarded(t, g, ClientListener, func(l *config.GatewayLimits) { l.ClientConns, l.ClientConnsPerSource = 3, 2 })

	a, b := dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.1", addr)
	if modelsOn(a) != 200 || modelsOn(b) != 200 {
		t.Fatal("connections within the caps were not served")
	}
	// A third from the same address is closed unanswered...
	if code := modelsOn(dialFrom(t, "127.0.0.1", addr)); code != 0 {
		t.Errorf("over the per-source cap: %d, want the connection closed", code)
	}
	// ...while another address still gets in,
	if code := modelsOn(dialFrom(t, "127.0.0.2", addr)); code != 200 {
		t.Errorf("another source: %d", code)
	}
	// When the listener is full of idle keep-alives, a new client closes
	// the one idle the longest (a) rather than being turned away.
	if code := modelsOn(dialFrom(t, "127.0.0.3", addr)); code != 200 {
		t.Errorf("a new client with the listener full of idle connections: %d, want served", code)
	}
	if s, idle := shedTotal(g, "client", "source"), shedTotal(g, "client", "idle"); s != 1 || idle != 1 {
		t.Errorf("sheds: source %v idle %v, want 1 and 1", s, idle)
	}
	a.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := a.Read(make([]byte, 1)); err == nil {
		t.Error("the connection idle the longest was not closed")
	}
	// A reload that raises the cap applies to the next connection: four
	// connections are held without closing any.
	next := *g.cfg.Load()
	next.Limits.ClientConns, next.Limits.ClientConnsPerSource = 4, 0
	if err := g.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if code := modelsOn(dialFrom(t, "127.0.0.4", addr)); code != 200 || shedTotal(g, "client", "idle") != 1 {
		t.Errorf("after raising the cap: %d, idle sheds %v", code, shedTotal(g, "client", "idle"))
	}
	// Timeouts of the listener itself need a restart, and say so.
	idle := *g.cfg.Load()
	idle.Limits.ClientIdleTimeout = config.Duration(time.Minute)
	if err := g.Reload(&idle); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Errorf("a reload changing the idle timeout: %v", err)
	}
	// A rejected reload changes nothing.
	if got := g.cfg.Load().Limits; got.ClientIdleTimeout == idle.Limits.ClientIdleTimeout || got.ClientConns != 4 {
		t.Errorf("after a rejected reload the limits are %+v", got)
	}
}

func TestHopConnectionCapCountsAsHop(t *testing.T) {
	g := gatewayWithEastPool(t)
	defer g.Close()
	addr := serveGuarded(t, g, HopListener, func(l *config.GatewayLimits) { l.HopConns = 1 })
	held := dialFrom(t, "127.0.0.1", addr)
	if modelsOn(held) != 200 {
		t.Fatal("the first hop connection was not served")
	}
	if code := modelsOn(dialFrom(t, "127.0.0.1", addr)); code != 0 {
		t.Errorf("over the hop cap: %d", code)
	}
	if got := shedTotal(g, "hop", "total"); got != 1 {
		t.Errorf("hop total sheds %v, want 1", got)
	}
}

// TestTrickledBodyTimesOut: a client that sends its headers and then
// trickles (or stops sending) its body gets 408 within the body timeout and
// loses its connection; it holds nothing after.
func TestTrickledBodyTimesOut(t *testing.T) {
	g := gatewayWithEastPool(t)
	defer g.Close()
	addr := serveGuarded(t, g, ClientListener, func(l *config.GatewayLimits) { l.BodyReadTimeout = config.Duration(300 * time.Millisecond) })
	c := dialFrom(t, "127.0.0.1", addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: grid\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "request_timeout") {
		t.Errorf("stalled body: %d %s", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("answered after %v", d)
	}
	if !resp.Close {
		t.Error("the connection of a timed-out body stays open")
	}
}

// TestBodyTimeoutSparesTheStream: the body deadline covers the body only;
// an answer that streams for longer than it is not cut.
func TestBodyTimeoutSparesTheStream(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		for i := range 8 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer upstream.Close()
	g := gatewayWithEastPoolAt(t, upstream.URL)
	defer g.Close()
	addr := serveGuarded(t, g, ClientListener, func(l *config.GatewayLimits) { l.BodyReadTimeout = config.Duration(200 * time.Millisecond) })
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+sim.DefaultModel+`","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Errorf("an 800ms stream under a 200ms body timeout: %d %v %q", resp.StatusCode, err, body)
	}
}

// TestSlowHeadersAreCut: a client that opens a request and never finishes
// its headers (slowloris) loses its connection after the header timeout.
func TestSlowHeadersAreCut(t *testing.T) {
	g := gatewayWithEastPool(t)
	defer g.Close()
	addr := serveGuarded(t, g, ClientListener, func(l *config.GatewayLimits) { l.HeaderReadTimeout = config.Duration(300 * time.Millisecond) })
	c := dialFrom(t, "127.0.0.1", addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: grid\r\nX-Slow: ")
	io.Copy(io.Discard, c) // returns when the server closes
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a client that never finished its headers held the connection %v", d)
	}
	// Headers over 64 KiB are refused.
	big := dialFrom(t, "127.0.0.1", addr)
	big.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(big, "GET /v1/models HTTP/1.1\r\nHost: grid\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 128<<10))
	resp, err := http.ReadResponse(bufio.NewReader(big), nil)
	if err == nil && resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("128 KiB of headers: %d, want 431", resp.StatusCode)
	}
}

func TestMetricsListenerCap(t *testing.T) {
	g := gatewayWithEastPool(t)
	defer g.Close()
	addr := serveGuarded(t, g, MetricsListener, func(*config.GatewayLimits) {})
	for range MetricsConns {
		dialFrom(t, "127.0.0.1", addr)
	}
	if code := modelsOn(dialFrom(t, "127.0.0.1", addr)); code != 0 {
		t.Errorf("connection %d over the metrics cap: %d, want closed", MetricsConns+1, code)
	}
	if got := shedTotal(g, "metrics", "total"); got != 1 {
		t.Errorf("metrics total sheds %v, want 1", got)
	}
}

// TestMemoryLimitFromBodies: with neither GOMEMLIMIT nor a cgroup limit,
// the memory limit is the body budget plus the headroom, and the default
// budget stays 512 MiB (not a quarter of the limit it was derived from);
// GOMEMLIMIT, or a limit already set, is left alone.
func TestMemoryLimitFromBodies(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old); limitFromBodies.Store(0) })
	reset := func() { debug.SetMemoryLimit(math.MaxInt64); limitFromBodies.Store(0) }

	reset()
	if got := SetMemoryLimitFromBodies(0); got != 512<<20+bodyHeadroom || defaultBodyBudget() != 512<<20 {
		t.Errorf("default: limit %d, budget %d; want %d and %d", got, defaultBodyBudget(), 512<<20+bodyHeadroom, 512<<20)
	}
	if got := SetMemoryLimitFromBodies(0); got != 0 {
		t.Errorf("a limit already set was replaced by %d", got)
	}
	reset()
	if got := SetMemoryLimitFromBodies(100 << 20); got != 100<<20+bodyHeadroom {
		t.Errorf("limits.bodyBytes 100 MiB: limit %d", got)
	}
	reset()
	t.Setenv("GOMEMLIMIT", "1GiB")
	if got := SetMemoryLimitFromBodies(0); got != 0 || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("with GOMEMLIMIT set: limit %d", got)
	}
}

// TestListenReusePort: with reusePort a second gateway binds the address
// the first holds (a restart in place); without it the
// second is refused, so two gateways given one address by mistake fail at
// start.
func TestListenReusePort(t *testing.T) {
	ctx := context.Background()
	first, err := Listen(ctx, "127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	addr := first.Addr().String()
	second, err := Listen(ctx, addr, true)
	if err != nil {
		t.Fatalf("a second listener with reusePort on %s: %v", addr, err)
	}
	second.Close()
	if ln, err := Listen(ctx, addr, false); err == nil {
		ln.Close()
		t.Errorf("a listener without reusePort bound %s, which another holds", addr)
	}
}
