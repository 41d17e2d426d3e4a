package operator

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

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
	resp, err := c.Get("https://" + addr + SignalsPath)
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
	time.Sleep(100 * time.Millisecond)
	// ...so a third from the same source is shed at once,
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
