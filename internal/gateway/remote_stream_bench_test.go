package gateway_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/gateway"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/sim"
)

// BenchmarkRemoteStreamMemory measures what one concurrent SSE stream
// served by a peer site costs the two gateways it crosses together: the
// entry gateway, whose site does not serve the model, takes the client's
// stream and sends it over the mTLS hop (HTTP/2) to the exit gateway,
// which forwards it to its upstream (one event, then held). Both gateways
// run in this process, served as `grid gateway` serves them (guarded
// listeners, detached client streams); the clients and the upstream are in
// it too, and are measured alone first (streams straight to the upstream),
// so the difference in Go heap plus goroutine stacks, over N, is the two
// gateways' cost per stream. nginx is measured in the same run as the
// same chain of two (entry nginx to exit nginx over keep-alive HTTP/1.1):
// the growth of both instances' resident memory. BENCHMARKS.md has the
// figures and the command. STREAM_HEAP_PROFILE=FILE writes the heap
// profile with the streams open through the gateways, and FILE.goroutines
// their goroutines.
func BenchmarkRemoteStreamMemory(b *testing.B) {
	gateway.RaiseFileLimit()
	held := newHeldUpstream()
	defer held.releaseAll()
	upLn, upstream := listenAny(b)
	serve(b, upLn, held, nil)
	entryGateway, entry := startRemoteStreamGrid(b, upstream)
	for _, n := range []int{2000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			for range b.N {
				direct, stackDirect := heldStreamsMemory(b, held, nil, upstream, n, "")
				through, stackThrough := heldStreamsMemory(b, held, entryGateway, entry, n, os.Getenv("STREAM_HEAP_PROFILE"))
				b.ReportMetric(float64(through-direct)/float64(n), "B/stream")
				b.ReportMetric(float64(stackThrough-stackDirect)/float64(n), "stack-B/stream")
				if growth := nginxChainGrowth(b, held, upstream, n); growth > 0 {
					b.ReportMetric(float64(growth)/float64(n), "nginx-pair-RSS-B/stream")
				}
			}
		})
	}
}

// startRemoteStreamGrid runs two sites: "exit", whose one provider of the
// default model sends its requests to upstream (and is scraped from a
// sim, idle, for its load), and "entry", which serves another model only,
// so every request for the default model it takes goes over the hop to
// exit. It returns the entry gateway and its client address once a
// stream through it has reached upstream.
func startRemoteStreamGrid(b *testing.B, upstream string) (*gateway.Gateway, string) {
	dir := b.TempDir()
	identity.Init(dir, "grid.internal", time.Now())
	type site struct {
		name, model, client, hop, signals string
		lns                               map[string]net.Listener
	}
	sites := []*site{{name: "entry", model: "other-model"}, {name: "exit", model: sim.DefaultModel}}
	for _, st := range sites {
		identity.Issue(dir, st.name, nil, time.Now())
		st.lns = map[string]net.Listener{}
		for _, l := range []struct {
			key  string
			addr *string
		}{{"client", &st.client}, {"hop", &st.hop}, {"signals", &st.signals}} {
			st.lns[l.key], *l.addr = listenAny(b)
		}
	}
	var entryGateway *gateway.Gateway
	for i, st := range sites {
		peer := sites[1-i]
		_, metrics := startCachingSim(b, 8)
		requests := metrics
		if st.name == "exit" {
			requests = upstream
		}
		id := startBenchOperator(b, st.name, fmt.Sprintf("site: %s\n%sstateDir: %s\nscrapeInterval: 100ms\npeerPollInterval: 200ms\npeers:\n  - {site: %s, signals: 'https://%s', gateway: 'https://%s'}\nproviders:\n  - {name: %s-pool, model: %s, kind: vllm, upstream: 'http://%s', metrics: {endpoint: 'http://%s'}}\n",
			st.name, benchTLS(dir, st.name), b.TempDir(), peer.name, peer.signals, peer.hop, st.name, st.model, requests, metrics), st.lns["signals"])
		// Room for every stream on both listeners: the default caps would
		// shed them.
		gw := startBenchGateway(b, st.name, fmt.Sprintf("site: %s\n%slisten: %q\nhop: {listen: %q}\nmetrics: {listen: '127.0.0.1:0'}\noperator: {signals: 'https://%s'}\npollInterval: 200ms\nlimits: {clientConns: 20000}\n",
			st.name, benchTLS(dir, st.name), st.client, st.hop, st.signals), id)
		if st.name == "entry" {
			entryGateway = gw
		}
		for which, conf := range map[gateway.Listener]*tls.Config{gateway.ClientListener: nil, gateway.HopListener: gateway.HopTLS(id)} {
			srv := gw.Server(which, nil)
			go srv.Serve(gw.Guard(which, st.lns[which.String()], conf))
			b.Cleanup(func() { srv.Close() })
		}
	}
	entry := sites[0].client
	body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, sim.DefaultModel)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := client.Post("http://"+entry+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && resp.Header.Get("X-Grid-Site") == "exit" {
				return entryGateway, entry
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("no stream through the entry gateway to exit within 30 s: %v", err)
		}
	}
}

// heldStreamsMemory opens n streams at target, waits for each one's first
// two events (and, through the entry gateway g, for each to be detached
// or wait to be), and returns the heap and stack bytes in use with them
// open, after a collection (and writes the heap profile to profile, when named). It
// closes them before it returns and waits for the process's goroutines to
// settle, so the next measurement starts from the same floor.
func heldStreamsMemory(b *testing.B, held *heldUpstream, g *gateway.Gateway, target string, n int, profile string) (total, stacks uint64) {
	before := runtime.NumGoroutine()
	conns, err := gateway.OpenStreams(target, n)
	defer closeAndSettle(held, conns, before)
	if err != nil {
		b.Fatal(err)
	}
	if g != nil {
		gateway.WaitAllDetached(b, g, n)
	}
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if profile != "" {
		if out, err := os.Create(profile); err == nil {
			pprof.Lookup("heap").WriteTo(out, 0)
			out.Close()
		}
		if out, err := os.Create(profile + ".goroutines"); err == nil {
			pprof.Lookup("goroutine").WriteTo(out, 1)
			out.Close()
		}
	}
	return ms.HeapInuse + ms.StackInuse, ms.StackInuse
}

// nginxChainGrowth opens n streams through two nginx instances in a row
// (the entry one proxying to the exit one, which proxies to upstream) and
// returns the growth of their resident memory; 0 when nginx is not
// installed.
func nginxChainGrowth(b *testing.B, held *heldUpstream, upstream string, n int) int64 {
	exit, exitPID := gateway.StartNginx(b, "http://"+upstream)
	if exit == "" {
		return 0
	}
	entry, entryPID := gateway.StartNginx(b, exit)
	before, goroutines := gateway.NginxRSS(exitPID, entryPID), runtime.NumGoroutine()
	conns, err := gateway.OpenStreams(strings.TrimPrefix(entry, "http://"), n)
	defer closeAndSettle(held, conns, goroutines)
	if err != nil {
		b.Fatal(err)
	}
	return gateway.NginxRSS(exitPID, entryPID) - before
}

// closeAndSettle closes conns, ends the upstream's held streams (a
// detached stream notices its client gone only when it writes to it), and
// waits, up to 30 s, for this process's goroutines to come back near
// goroutines, so the next measurement starts from the same floor with its
// descriptors free.
func closeAndSettle(held *heldUpstream, conns []net.Conn, goroutines int) {
	for _, c := range conns {
		c.Close()
	}
	held.releaseAll()
	for deadline := time.Now().Add(30 * time.Second); runtime.NumGoroutine() > goroutines+50 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// heldUpstream is the benchmark's upstream: gateway.HeldStream's answers,
// held until releaseAll ends those begun before it.
type heldUpstream struct {
	mu      sync.Mutex
	release chan struct{}
	serve   http.Handler
}

func newHeldUpstream() *heldUpstream {
	u := &heldUpstream{}
	u.releaseAll()
	return u
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	serve := u.serve
	u.mu.Unlock()
	serve.ServeHTTP(w, r)
}

// releaseAll ends every stream held so far; later ones are held anew.
func (u *heldUpstream) releaseAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.release != nil {
		close(u.release)
	}
	u.release = make(chan struct{})
	u.serve = gateway.HeldStream(u.release)
}
