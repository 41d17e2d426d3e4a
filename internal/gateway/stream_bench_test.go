package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/sim"
)

// BenchmarkStreamMemory measures what one concurrent SSE stream costs the
// gateway: N clients each open a streaming completion and hold it open
// (the upstream sends one event, then waits), first straight to the
// upstream, then through the gateway; the difference in heap and goroutine
// stacks, divided by N, is the gateway's cost per stream. Upstream and
// clients are in this process too, and cost the same in both runs. It
// reports B/stream (heap + stacks) and stack-B/stream; BENCHMARKS.md has
// the figures. A stream holds four descriptors here (client, gateway's two,
// upstream), so 4,500 streams is what a 20,000-descriptor limit allows.
func BenchmarkStreamMemory(b *testing.B) {
	raiseFileLimit()
	for _, n := range []int{2000, 4500} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			for range b.N {
				direct, stackDirect, _ := holdStreams(b, n, "")
				through, stackThrough, _ := holdStreams(b, n, "gateway")
				b.ReportMetric(float64(through-direct)/float64(n), "B/stream")
				b.ReportMetric(float64(stackThrough-stackDirect)/float64(n), "stack-B/stream")
				if _, _, nginx := holdStreams(b, n, "nginx"); nginx > 0 {
					b.ReportMetric(float64(nginx)/float64(n), "nginx-RSS-B/stream")
				}
			}
		})
	}
}

// nginxPID is the master process startNginx started last.
var nginxPID int

// nginxRSS sums the resident memory of the masters' (the one startNginx
// started last when none is named) and their workers'.
func nginxRSS(masters ...int) int64 {
	var total int64
	for _, pid := range nginxProcs(masters...) {
		_, rss := procStatus(pid)
		total += rss
	}
	return total
}

// nginxProcs lists, as /proc entries, nginx's masters (the one startNginx
// started last when none is named) and their workers.
func nginxProcs(masters ...int) []string {
	if len(masters) == 0 {
		masters = []int{nginxPID}
	}
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _ := procStatus(e.Name()); slices.Contains(masters, pid) || slices.Contains(masters, ppid) {
			out = append(out, e.Name())
		}
	}
	return out
}

// procStatus reads a process's parent and resident memory from
// /proc/PID/status ("self" for this one); zeros when it cannot.
func procStatus(pid string) (ppid int, rss int64) {
	f := procStatusFields(pid)
	return int(f["PPid:"]), f["VmRSS:"] << 10
}

// procStatusFields is /proc/PID/status ("self" for this one), each field's
// first number (memory in kB, as the file gives it); nil when it cannot
// be read.
func procStatusFields(pid string) map[string]int64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return nil
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			out[f[0]], _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return out
}

// raiseFileLimit lifts the open-file limit: every stream holds four
// descriptors in this process. Past the hard limit only root may go.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	want := uint64(65536)
	if lim.Max < want && syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}) == nil {
		return
	}
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// holdStreams opens n streams (straight, or via "gateway" or "nginx"),
// waits until each received its first two events (and, through the
// gateway, was detached or waits to be), and returns the heap and stack
// bytes in use with them open, after a collection, and for nginx the
// growth of its resident memory.
func holdStreams(b *testing.B, n int, via string) (total, stacks uint64, nginxGrowth int64) {
	b.Helper()
	release := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	upstream := &http.Server{Handler: heldStream(release)}
	go upstream.Serve(ln)
	defer upstream.Close()
	target := ln.Addr().String()
	var nginxBefore int64
	if via == "nginx" {
		u := startNginx(b, "http://"+target)
		if u == "" {
			return 0, 0, 0
		}
		target = strings.TrimPrefix(u, "http://")
		nginxBefore = nginxRSS()
	}
	viaGateway := via == "gateway"
	var g *Gateway
	if viaGateway {
		var stop func()
		g, target, stop = serveStreamGateway(b, "http://"+target, n)
		defer stop()
	}
	conns, err := openStreams(target, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err != nil {
		b.Fatal(err)
	}
	if g != nil {
		waitAllDetached(b, g, n)
	}
	if via == "nginx" {
		nginxGrowth = nginxRSS() - nginxBefore
	}
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if f := os.Getenv("STREAM_HEAP_PROFILE"); f != "" && viaGateway {
		if out, err := os.Create(f); err == nil {
			pprof.Lookup("heap").WriteTo(out, 0)
			out.Close()
		}
	}
	close(release)
	return ms.HeapInuse + ms.StackInuse, ms.StackInuse, nginxGrowth
}

// heldSecondEvent is when a held stream sends its second event: past
// limits.detachAfter's default, so that a gateway detaches the stream
// at it, as it would a stream of an engine that has run that long.
const heldSecondEvent = config.DefaultDetachAfter + 100*time.Millisecond

// heldStream is the benchmarks' upstream: an SSE answer that sends an
// event, another heldSecondEvent later, and holds until release is
// closed or the caller leaves.
func heldStream(release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		event := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
		io.WriteString(w, event)
		w.(http.Flusher).Flush()
		select {
		case <-time.After(heldSecondEvent):
			io.WriteString(w, event)
			w.(http.Flusher).Flush()
		case <-release:
		case <-r.Context().Done():
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
}

// openStreams opens n streaming completions at target and returns once
// each has received its first two events (heldStream), or with the first
// failure. The connections it opened are returned either way, for the
// caller to close.
func openStreams(target string, n int) ([]net.Conn, error) {
	body := `{"model":"` + sim.DefaultModel + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	conns := make([]net.Conn, 0, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		c, err := net.Dial("tcp", target)
		if err != nil {
			wg.Wait()
			return conns, fmt.Errorf("stream %d: %w", i, err)
		}
		conns = append(conns, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.WriteString(c, req)
			c.SetReadDeadline(time.Now().Add(120 * time.Second))
			r := bufio.NewReaderSize(c, 512)
			for events := 0; events < 2; {
				line, err := r.ReadString('\n')
				if err != nil {
					errs <- err
					return
				}
				if strings.HasPrefix(line, "data: ") {
					events++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return conns, fmt.Errorf("a stream ended before its second event: %w", err)
	}
	return conns, nil
}

// waitAllDetached waits until each of n streams g holds is detached or
// waits to be: one detached at its second event (heldStream) is counted
// just after its client has that event, and one whose head reached the
// gateway late, under the load of n opening at once, reads its second
// event within limits.detachAfter and, sent nothing after, stays with
// the server, as a silent stream would (at most maxWaitingToDetach).
func waitAllDetached(b *testing.B, g *Gateway, n int) {
	b.Helper()
	held := func() int { return g.streams.Len() + int(g.streams.waiting.Load()) }
	for deadline := time.Now().Add(30 * time.Second); held() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("after 30 s, %d of %d streams detached and %d waiting; the gateway's ends and errors: %s",
				g.streams.Len(), n, g.streams.waiting.Load(), endsAndErrors(g))
		}
	}
}

// endsAndErrors is what g counted of requests that ended, failed or were
// shed, for a benchmark that lost some.
func endsAndErrors(g *Gateway) string {
	mfs, err := g.m.reg.Gather()
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, mf := range mfs {
		switch mf.GetName() {
		case "grid_gateway_request_duration_seconds", "grid_gateway_upstream_errors_total", "grid_gateway_connections_shed_total", "grid_gateway_streams_ended_early_total":
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			out = append(out, fmt.Sprintf("%s%v %g", mf.GetName(), m.GetLabel(), v))
		}
	}
	return strings.Join(out, "; ")
}

// serveStreamGateway serves a benchmark gateway in front of upstream,
// admitting n client connections (the default 4,096 would shed the rest),
// and returns it, its address and what stops it.
func serveStreamGateway(b *testing.B, upstream string, n int) (*Gateway, string, func()) {
	g := benchGateway(b, upstream)
	cfg := *g.cfg.Load()
	cfg.Limits.ClientConns = n + 100
	g.cfg.Store(&cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := g.Server(ClientListener, nil)
	go srv.Serve(g.Guard(ClientListener, ln, nil))
	return g, ln.Addr().String(), func() {
		srv.Close()
		g.Close()
	}
}
