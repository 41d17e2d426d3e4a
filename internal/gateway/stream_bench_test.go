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
// waits until each received its first event, and returns the heap and
// stack bytes in use with them open, after a collection, and for nginx the
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
	if viaGateway {
		var stop func()
		target, stop = serveStreamGateway(b, "http://"+target, n)
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

// heldStream is the benchmarks' upstream: an SSE answer that sends one
// event and holds until release is closed or the caller leaves.
func heldStream(release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
}

// openStreams opens n streaming completions at target and returns once
// each has received its first event, or with the first failure. The
// connections it opened are returned either way, for the caller to close.
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
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					errs <- err
					return
				}
				if strings.HasPrefix(line, "data: ") {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return conns, fmt.Errorf("a stream ended before its first event: %w", err)
	}
	return conns, nil
}

// serveStreamGateway serves a benchmark gateway in front of upstream,
// admitting n client connections (the default 4,096 would shed the rest),
// and returns its address and what stops it.
func serveStreamGateway(b *testing.B, upstream string, n int) (string, func()) {
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
	return ln.Addr().String(), func() {
		srv.Close()
		g.Close()
	}
}
