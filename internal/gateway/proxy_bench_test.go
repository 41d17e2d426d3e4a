package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/sim"
)

// benchGateway is a gateway whose only candidate is the given upstream,
// installed without an operator.
func benchGateway(tb testing.TB, upstream string) *Gateway {
	g, _ := newTestGateway(tb, "https://127.0.0.1:1")
	g.serving.Store(&signals.Serving{Site: "east", Providers: []signals.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: upstream}}})
	g.refresh()
	g.firstOnce.Do(func() { close(g.first) })
	// No operator feeds it: its board is taken as read, and never stale,
	// so requests do not wait for a poll that will not come.
	g.lastRead.Store(time.Now().Add(24 * time.Hour).UnixNano())
	return g
}

// newTestGateway is east's gateway reading the operator at operatorURL,
// with east's identity from a fresh grid CA (which an operator of the test
// can serve with).
func newTestGateway(tb testing.TB, operatorURL string) (*Gateway, *identity.Source) {
	return newTestGatewayIn(tb, tb.TempDir(), operatorURL)
}

// newTestGatewayIn is newTestGateway with its grid CA in dir, where a test
// can issue other sites' certificates.
func newTestGatewayIn(tb testing.TB, dir, operatorURL string) (*Gateway, *identity.Source) {
	identity.Init(dir, "grid.internal", time.Now())
	identity.Issue(dir, "east", nil, time.Now())
	cfg, err := config.ParseGateway("test", []byte(fmt.Sprintf("site: east\ntls: {ca: %q, cert: %q, key: %q}\noperator: {signals: %q}\n",
		filepath.Join(dir, "ca.crt"), filepath.Join(dir, "east.crt"), filepath.Join(dir, "east.key"), operatorURL)))
	if err != nil {
		tb.Fatal(err)
	}
	id, err := identity.LoadSource(*cfg.TLS, "grid.internal", "east", nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := New(cfg, Options{Identity: id})
	if err != nil {
		tb.Fatal(err)
	}
	return g, id
}

// load sends requests from workers concurrent clients for d and returns
// the latencies.
func load(url, body string, workers int, d time.Duration, stream bool) ([]time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				start := time.Now()
				resp, err := c.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					mu.Lock()
					firstErr = fmt.Errorf("status %d", resp.StatusCode)
					mu.Unlock()
					return
				}
				mu.Lock()
				lat = append(lat, time.Since(start))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat, firstErr
}

func pct(lat []time.Duration, p float64) time.Duration {
	slices.Sort(lat)
	return lat[int(float64(len(lat)-1)*p)]
}

// paced sends requests at a fixed rate for d, each on its own goroutine so
// a slow answer never delays the next send (open loop), and returns the
// latencies measured from each request's scheduled instant, so that
// queueing in the proxy is not hidden by a client that waited for it.
func paced(url, body string, rate int, d time.Duration) ([]time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	tr := &http.Transport{MaxIdleConnsPerHost: 512}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	interval := time.Second / time.Duration(rate)
	n := int(d / interval)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Post(url, "application/json", strings.NewReader(body))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			lat = append(lat, time.Since(at))
		}()
	}
	wg.Wait()
	return lat, firstErr
}

// startNginx runs nginx as a plain reverse proxy to upstream on a free
// loopback port (buffering off, so SSE streams through; keep-alive to the
// upstream, as the gateway has) and returns its base URL, or "" when nginx
// is not installed.
func startNginx(b *testing.B, upstream string) string {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		b.Log("nginx not installed (apt-get install nginx): skipping the nginx comparison")
		return ""
	}
	dir := b.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conf := fmt.Sprintf(`worker_processes auto;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
worker_rlimit_nofile 20000;
events { worker_connections 19500; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream sim { server %[2]s; keepalive 256; }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, dir, strings.TrimPrefix(upstream, "http://"), addr)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	nginxPID = cmd.Process.Pid
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGQUIT)
		cmd.Wait()
	})
	for deadline := time.Now().Add(5 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			b.Fatalf("nginx did not listen on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkProxyOverhead measures, in one run on loopback, requests sent
// straight to a sim, through the gateway and through nginx as a plain
// reverse proxy (when installed): throughput with 16 clients sending back
// to back for 3 s, then latency at a fixed rate of 1000 requests a second
// for 3 s. Run with -benchtime 1x; the figures are custom metrics.
func BenchmarkProxyOverhead(b *testing.B) {
	s, err := sim.New(sim.Options{Kind: sim.KindVLLM, Slots: 1024, TTFT: time.Microsecond, TPOT: time.Microsecond})
	if err != nil {
		b.Fatal(err)
	}
	simSrv := httptest.NewServer(s.Handler())
	defer simSrv.Close()
	// The gateway serves as `grid gateway` does: its own server on a
	// guarded client listener, so its streams are detached (detach.go).
	_, gwAddr, stop := serveStreamGateway(b, simSrv.URL, 4096)
	defer stop()
	targets := []struct{ name, url string }{{"direct", simSrv.URL}, {"gateway", "http://" + gwAddr}}
	if u := startNginx(b, simSrv.URL); u != "" {
		targets = append(targets, struct{ name, url string }{"nginx", u})
	}
	for _, mode := range []struct {
		name   string
		stream bool
	}{{"json", false}, {"sse", true}} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":8,"stream":%v}`, sim.DefaultModel, mode.stream)
		b.Run(mode.name, func(b *testing.B) {
			for b.Loop() {
				for _, t := range targets {
					url := t.url + "/v1/chat/completions"
					sat, err := load(url, body, 16, 3*time.Second, mode.stream)
					if err != nil {
						b.Fatalf("%s: %v", t.name, err)
					}
					b.ReportMetric(float64(len(sat))/3, t.name+"-req/s")
					fixed, err := paced(url, body, 1000, 3*time.Second)
					if err != nil {
						b.Fatalf("%s at 1000/s: %v", t.name, err)
					}
					b.ReportMetric(float64(pct(fixed, 0.5).Microseconds()), t.name+"-p50-µs")
					b.ReportMetric(float64(pct(fixed, 0.99).Microseconds()), t.name+"-p99-µs")
				}
			}
		})
	}
}
