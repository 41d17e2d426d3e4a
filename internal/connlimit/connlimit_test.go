package connlimit

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSourceKeys(t *testing.T) {
	for _, tc := range []struct {
		addr         string
		source, wide string
	}{
		{"192.0.2.7:443", "192.0.2.7/32", ""},
		{"[::ffff:192.0.2.7]:443", "192.0.2.7/32", ""},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64", "2001:db8:1::/48"},
		{"[::1]:443", "::/64", ""},                                  // loopback: no /48 group
		{"[fe80::1%eth0]:443", "fe80::/64", ""},                     // link-local
		{"[fd00:1:2:3::9]:443", "fd00:1:2:3::/64", "fd00:1:2::/48"}, // ULA is unicast too
	} {
		ap := netip.MustParseAddrPort(tc.addr)
		k := SourceKeys(net.TCPAddrFromAddrPort(ap))
		if k.Source.String() != tc.source {
			t.Errorf("%s: source %s, want %s", tc.addr, k.Source, tc.source)
		}
		wide := ""
		if k.Wide.IsValid() {
			wide = k.Wide.String()
		}
		if wide != tc.wide {
			t.Errorf("%s: /48 %q, want %q", tc.addr, wide, tc.wide)
		}
	}
}

// sheds collects the limits that shed connections.
type sheds struct {
	mu sync.Mutex
	by map[string]int
}

func (s *sheds) add(limit string) { s.mu.Lock(); s.by[limit]++; s.mu.Unlock() }
func (s *sheds) get(limit string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.by[limit]
}

// serve accepts on l and holds each connection open until the client closes
// it, as a server mid-request would.
func serve(t *testing.T, l *Listener) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 1)
				c.Read(buf) // returns when the client closes
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
}

// closedByServer reports whether the server closed c without a byte.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestTotalLimitShedsAndReleases(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sheds{by: map[string]int{}}
	l := New(raw, Limits{Total: 3}, s.add)
	serve(t, l)
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waitOpen(t, l, 3)
	over, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if !closedByServer(over) {
		t.Fatal("a fourth connection over a total of 3 was kept")
	}
	over.Close()
	if got := s.get(ShedTotal); got != 1 {
		t.Errorf("total sheds = %d, want 1", got)
	}
	// Closing one gives its place to the next.
	held[0].Close()
	waitOpen(t, l, 2)
	next, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	waitOpen(t, l, 3)
	next.Close()
	for _, c := range held[1:] {
		c.Close()
	}
	waitOpen(t, l, 0)
}

func TestPerSourceLimitLeavesOtherSourcesIn(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sheds{by: map[string]int{}}
	l := New(raw, Limits{Total: 100, PerSource: 2}, s.add)
	serve(t, l)
	dialFrom := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// One source floods: its third connection is shed.
	dialFrom("127.0.0.1")
	dialFrom("127.0.0.1")
	waitOpen(t, l, 2)
	if !closedByServer(dialFrom("127.0.0.1")) {
		t.Fatal("a source's third connection over a per-source cap of 2 was kept")
	}
	if got := s.get(ShedSource); got != 1 {
		t.Errorf("source sheds = %d, want 1", got)
	}
	// Another source (all of 127/8 is loopback here) still gets in.
	dialFrom("127.0.0.2")
	waitOpen(t, l, 3)
}

func TestPer48Limit(t *testing.T) {
	l := New(nil, Limits{PerSource: 8, PerSource48: 3}, nil)
	for i := range 3 {
		// Three different /64s of one /48.
		a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, byte(i), 15: 1})
		if lim := l.admit(SourceKeys(net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, 1)))); lim != "" {
			t.Fatalf("connection %d shed by %s", i, lim)
		}
	}
	fourth := SourceKeys(net.TCPAddrFromAddrPort(netip.MustParseAddrPort("[2001:db8:1:9::1]:1")))
	if lim := l.admit(fourth); lim != ShedSource {
		t.Errorf("a fourth /64 of a full /48: %q, want %q", lim, ShedSource)
	}
	other := SourceKeys(net.TCPAddrFromAddrPort(netip.MustParseAddrPort("[2001:db8:2::1]:1")))
	if lim := l.admit(other); lim != "" {
		t.Errorf("another /48 shed by %s", lim)
	}
	l.release(&conn{l: l, keys: other})
	if l.Open() != 3 || len(l.perSource) != 4 {
		t.Errorf("after release: %d open, %d groups", l.Open(), len(l.perSource))
	}
}

func waitOpen(t *testing.T, l *Listener, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Open() != want {
		if time.Now().After(deadline) {
			t.Fatalf("open connections = %d, want %d", l.Open(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIdleConnectionsGoFirst: with the total reached, a new connection
// closes the one idle the longest instead of being turned away; with none
// idle it is turned away. Limits set later apply to new connections.
func TestIdleConnectionsGoFirst(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var shed []string
	var mu sync.Mutex
	l := New(raw, Limits{Total: 2}, func(limit string) { mu.Lock(); shed = append(shed, limit); mu.Unlock() })
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	first, second := <-accepted, <-accepted
	// Reported through a TLS layer, as a server over TLS reports it.
	l.SetIdle(tls.Server(first, &tls.Config{}), true)
	time.Sleep(time.Millisecond)
	l.SetIdle(second, true)
	l.SetIdle(second, false) // second is busy again
	dial()
	var third net.Conn
	select {
	case third = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the new connection was turned away: the idle one was not closed for it")
	}
	first.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := first.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Error("the idle connection was not closed for the new one")
	}
	mu.Lock()
	if len(shed) != 1 || shed[0] != ShedIdle {
		t.Errorf("shed %v, want one idle", shed)
	}
	mu.Unlock()
	// Nothing idle: the next is turned away.
	c := dial()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a fourth connection with none idle: %v, want closed", err)
	}
	// A raised limit applies to the next connection.
	l.SetLimits(Limits{Total: 3})
	dial()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Error("a connection within the raised limit was not accepted")
	}
	_ = third
}
