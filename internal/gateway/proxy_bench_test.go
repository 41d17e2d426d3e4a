package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/operator"
	"github.com/grid-inference/grid/internal/sim"
)

// benchGateway is a gateway whose only candidate is the given upstream,
// installed without an operator.
func benchGateway(tb testing.TB, upstream string) *Gateway {
	dir := tb.TempDir()
	identity.Init(dir, "grid.internal", time.Now())
	identity.Issue(dir, "east", nil, time.Now())
	cfg, err := config.ParseGateway("bench", []byte(fmt.Sprintf("site: east\ntls: {ca: %q, cert: %q, key: %q}\noperator: {signals: 'https://127.0.0.1:1'}\n",
		filepath.Join(dir, "ca.crt"), filepath.Join(dir, "east.crt"), filepath.Join(dir, "east.key"))))
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
	g.serving.Store(&operator.Serving{Site: "east", Providers: []operator.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: upstream}}})
	g.refresh()
	g.firstOnce.Do(func() { close(g.first) })
	return g
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

// BenchmarkProxyOverhead measures, in one run on loopback, the latency and
// throughput of requests sent straight to a sim and through the gateway,
// at a fixed concurrency. Run with -benchtime 1x; the figures are custom
// metrics.
func BenchmarkProxyOverhead(b *testing.B) {
	s, err := sim.New(sim.Options{Kind: sim.KindVLLM, Slots: 1024, TTFT: time.Microsecond, TPOT: time.Microsecond})
	if err != nil {
		b.Fatal(err)
	}
	simSrv := httptest.NewServer(s.Handler())
	defer simSrv.Close()
	g := benchGateway(b, simSrv.URL)
	defer g.Close()
	gwSrv := httptest.NewServer(g.ClientHandler())
	defer gwSrv.Close()
	for _, mode := range []struct {
		name   string
		stream bool
	}{{"json", false}, {"sse", true}} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":8,"stream":%v}`, sim.DefaultModel, mode.stream)
		b.Run(mode.name, func(b *testing.B) {
			for b.Loop() {
				direct, err := load(simSrv.URL+"/v1/chat/completions", body, 16, 3*time.Second, mode.stream)
				if err != nil {
					b.Fatal(err)
				}
				via, err := load(gwSrv.URL+"/v1/chat/completions", body, 16, 3*time.Second, mode.stream)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(len(direct))/3, "direct-req/s")
				b.ReportMetric(float64(len(via))/3, "gateway-req/s")
				b.ReportMetric(float64(pct(direct, 0.5).Microseconds()), "direct-p50-µs")
				b.ReportMetric(float64(pct(via, 0.5).Microseconds()), "gateway-p50-µs")
				b.ReportMetric(float64(pct(direct, 0.99).Microseconds()), "direct-p99-µs")
				b.ReportMetric(float64(pct(via, 0.99).Microseconds()), "gateway-p99-µs")
			}
		})
	}
}
