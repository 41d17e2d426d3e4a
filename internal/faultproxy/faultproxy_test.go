package faultproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(addr string, timeout time.Duration) (string, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// proxyToHello starts a proxy in front of a server that answers "hello".
func proxyToHello(t *testing.T) *Proxy {
	t.Helper()
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	p, err := Start(strings.TrimPrefix(backend.URL, "http://"))
	if err != nil {
		backend.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); backend.Close() })
	return p
}

func TestModes(t *testing.T) {
	p := proxyToHello(t)

	if body, err := get(p.Addr(), 2*time.Second); err != nil || body != "hello" {
		t.Fatalf("pass: %q %v", body, err)
	}
	p.Set(Refuse)
	if _, err := get(p.Addr(), 2*time.Second); err == nil {
		t.Error("refuse: a request got through")
	}
	p.Set(Blackhole)
	start := time.Now()
	if _, err := get(p.Addr(), 300*time.Millisecond); err == nil || time.Since(start) < 250*time.Millisecond {
		t.Errorf("blackhole: %v after %v, want a client timeout", err, time.Since(start))
	}
	p.Set(Trickle)
	start = time.Now()
	// About 100 bytes of answer at one per 200ms: far over a 1s budget.
	if _, err := get(p.Addr(), time.Second); err == nil {
		t.Errorf("trickle: a whole answer within 1s (%v)", time.Since(start))
	}
	p.SetResponse([]byte("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\ngarbage"))
	if body, err := get(p.Addr(), 2*time.Second); err != nil || body != "garbage" {
		t.Errorf("respond: %q %v", body, err)
	}
	p.Set(Pass)
	if body, err := get(p.Addr(), 2*time.Second); err != nil || body != "hello" {
		t.Errorf("healed: %q %v", body, err)
	}
}

// TestSetCutsOpenConnections: a connection kept alive from before a fault
// does not carry traffic around it.
func TestSetCutsOpenConnections(t *testing.T) {
	p := proxyToHello(t)
	c := &http.Client{Timeout: 300 * time.Millisecond}
	defer c.CloseIdleConnections()
	for range 2 {
		resp, err := c.Get("http://" + p.Addr() + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	p.Set(Blackhole)
	if resp, err := c.Get("http://" + p.Addr() + "/"); err == nil {
		resp.Body.Close()
		t.Error("a kept-alive connection carried a request through a blackhole")
	}
}

// TestDelay: a request and its answer each take the delay, and a large
// answer arrives whole and in order.
func TestDelay(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, big) }))
	defer backend.Close()
	p, err := Start(strings.TrimPrefix(backend.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const delay = 150 * time.Millisecond
	p.SetDelay(delay)
	start := time.Now()
	body, err := get(p.Addr(), 5*time.Second)
	took := time.Since(start)
	if err != nil || body != big {
		t.Fatalf("delayed: %d bytes, %v; want the 1 MiB answer whole", len(body), err)
	}
	if took < 2*delay {
		t.Errorf("a round trip through a %v link took %v, want at least %v", delay, took, 2*delay)
	}
	p.Set(Pass)
	if body, err := get(p.Addr(), 2*time.Second); err != nil || body != big {
		t.Fatalf("healed: %d bytes, %v", len(body), err)
	}
}
