package operator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/signals"

	"github.com/grid-inference/grid/internal/identity"
)

// client is one connection's worth of HTTP client: its own transport keeps
// its own connection alive.
func client(t *testing.T, from *identity.Source) *http.Client {
	t.Helper()
	conf, err := from.ClientTLS("east")
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf, MaxConnsPerHost: 1}, Timeout: 3 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func fetch(c *http.Client, addr string) (int, error) {
	resp, err := c.Get("https://" + addr + signals.SignalsPath)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func shedCount(t *testing.T, op *Operator, limit string) float64 {
	return counterValue(t, op, "grid_signals_connections_shed_total", "limit", limit)
}

func TestHandshakesPerSourceCap(t *testing.T) {
	dir := pki(t, "east", "west")
	lim := DefaultLimits
	lim.HandshakesPerSource = 2
	east := startSiteLimits(t, lim, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1")
	// Two connections that never handshake hold the source's slots...
	for range 2 {
		c, err := net.Dial("tcp", east.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// ...so a third from the same source is shed at once: the one accept
	// loop takes connections in the order the kernel queued them, so both
	// are counted before the third is looked at.
	c, _ := net.Dial("tcp", east.addr)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("third handshake not shed: %v", err)
	}
	if shedCount(t, east.op, "source") != 1 {
		t.Errorf("source sheds %v", shedCount(t, east.op, "source"))
	}
}

func TestHandshakeTimeout(t *testing.T) {
	dir := pki(t, "east")
	lim := DefaultLimits
	lim.Handshake = 200 * time.Millisecond
	east := startSiteLimits(t, lim, dir, "east", t.TempDir(), "", nil)
	c, _ := net.Dial("tcp", east.addr)
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	c.Read(make([]byte, 1))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a silent client held its handshake for %v", d)
	}
}

func TestPerPeerCap(t *testing.T) {
	dir := pki(t, "east", "west")
	lim := DefaultLimits
	lim.PerPeer = 1
	east := startSiteLimits(t, lim, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1")
	west := idSource(t, dir, "west")
	first := client(t, west)
	if code, err := fetch(first, east.addr); err != nil || code != 200 {
		t.Fatalf("first west connection: %d %v", code, err)
	}
	// The first connection stays open (keep-alive): a second gets 503.
	if code, err := fetch(client(t, west), east.addr); err != nil || code != 503 {
		t.Errorf("second west connection: %d %v", code, err)
	}
	if shedCount(t, east.op, "peer") != 1 {
		t.Errorf("peer sheds %v", shedCount(t, east.op, "peer"))
	}
	// The site's own gateway is not held back by the peer cap.
	if code, err := fetch(client(t, idSource(t, dir, "east")), east.addr); err != nil || code != 200 {
		t.Errorf("Local: %d %v", code, err)
	}
}

func TestTotalCapKeepsLocalReserve(t *testing.T) {
	dir := pki(t, "east", "west", "south")
	lim := DefaultLimits
	lim.MaxConns, lim.ReservedLocal = 3, 1
	east := startSiteLimits(t, lim, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1", "south=https://127.0.0.1:1")
	west, south, local := idSource(t, dir, "west"), idSource(t, dir, "south"), idSource(t, dir, "east")
	for _, from := range []*identity.Source{west, south} {
		if code, err := fetch(client(t, from), east.addr); err != nil || code != 200 {
			t.Fatalf("peer connection: %d %v", code, err)
		}
	}
	// Peers hold the two non-reserved connections: a third peer is shed,
	if _, err := fetch(client(t, west), east.addr); err == nil {
		t.Error("a peer took the connection reserved for Local")
	}
	// but Local still gets in.
	if code, err := fetch(client(t, local), east.addr); err != nil || code != 200 {
		t.Errorf("Local: %d %v", code, err)
	}
	if shedCount(t, east.op, "total") < 1 {
		t.Errorf("total sheds %v", shedCount(t, east.op, "total"))
	}
}

// pipeListener hands the server ends of in-memory connections to the
// signals server, each claiming a chosen remote address.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *pipeListener) Close() error   { return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv6loopback} }

// dialFrom opens an in-memory connection that the server sees coming from
// addr; the client end is returned.
func (l *pipeListener) dialFrom(addr string) net.Conn {
	client, server := net.Pipe()
	l.conns <- addrConn{Conn: server, remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr))}
	return client
}

// TestHandshakesPer48Cap: handshakes from many /64s of one global-unicast
// /48 share a cap, so a host cannot spread a flood over its prefixes; another
// /48 is unaffected.
func TestHandshakesPer48Cap(t *testing.T) {
	dir := pki(t, "east")
	east := startSiteLimits(t, DefaultLimits, dir, "east", t.TempDir(), "", nil)
	lim := DefaultLimits
	lim.HandshakesPer48 = 3
	pl := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { east.op.ServeSignals(ctx, pl, lim, time.Second); close(served) }()
	defer func() { cancel(); close(pl.done); <-served }()

	for i := range 3 { // three /64s of 2001:db8:1::/48, each one silent handshake
		c := pl.dialFrom(fmt.Sprintf("[2001:db8:1:%x::1]:40000", i))
		defer c.Close()
	}
	over := pl.dialFrom("[2001:db8:1:ff::1]:40000")
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a fourth /64 of a full /48 was not shed: %v", err)
	}
	if got := shedCount(t, east.op, "source"); got != 1 {
		t.Errorf("source sheds %v, want 1", got)
	}
	other := pl.dialFrom("[2001:db8:2::1]:40000")
	defer other.Close()
	other.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := other.Read(make([]byte, 1)); !isTimeout(err) {
		t.Errorf("another /48 was shed: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestOldConnectionClosesGracefully: past the age limit a connection gets
// its answer with Connection: close, and the next request opens a new one.
func TestOldConnectionClosesGracefully(t *testing.T) {
	dir := pki(t, "east")
	lim := DefaultLimits
	lim.MaxConnAge = 300 * time.Millisecond
	east := startSiteLimits(t, lim, dir, "east", t.TempDir(), "", nil)
	c := client(t, idSource(t, dir, "east"))
	get := func() (resp *http.Response, reused bool) {
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, "https://"+east.addr+signals.SignalsPath, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, reused
	}
	opened := time.Now()
	if resp, _ := get(); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("young connection: %d close=%v", resp.StatusCode, resp.Close)
	}
	// The same connection serves until it is old; the answer that closes it
	// comes on it, and not before the age limit.
	resp, reused := get()
	for !resp.Close && time.Since(opened) < 5*time.Second {
		if !reused {
			t.Fatal("the connection was replaced before it was old")
		}
		time.Sleep(50 * time.Millisecond)
		resp, reused = get()
	}
	if age := time.Since(opened); age < lim.MaxConnAge {
		t.Errorf("closed at %v, before the %v age limit", age, lim.MaxConnAge)
	}
	if !reused || resp.StatusCode != 200 || !resp.Close {
		t.Errorf("old connection: reused=%v %d close=%v, want its answer then a close", reused, resp.StatusCode, resp.Close)
	}
	if _, reused := get(); reused {
		t.Error("the old connection was used again")
	}
}

// TestSlowHeadersAfterHandshake: a verified peer that completes its
// handshake and then never finishes its request's headers loses the
// connection after the header bound, and its slot with it.
func TestSlowHeadersAfterHandshake(t *testing.T) {
	dir := pki(t, "east", "west")
	lim := DefaultLimits
	lim.HeaderRead, lim.PerPeer = 300*time.Millisecond, 1
	east := startSiteLimits(t, lim, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1")
	conf, err := idSource(t, dir, "west").ClientTLS("east")
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", east.addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	io.WriteString(c, "GET "+signals.SignalsPath+" HTTP/1.1\r\nHost: east\r\nX-Slow: ")
	io.Copy(io.Discard, c)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("a peer that never finished its headers held the connection %v", d)
	}
	// Its per-peer slot is free again: a well-behaved connection gets in.
	deadline := time.Now().Add(3 * time.Second)
	for {
		code, err := fetch(client(t, idSource(t, dir, "west")), east.addr)
		if err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot of a cut connection was not released: %d %v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
