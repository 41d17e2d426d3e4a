package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

// streamHelperEnv makes the test binary a helper process of
// BenchmarkStreamMemoryApart: "upstream" serves SSE streams that send one
// event and hold, "clients ADDR N" opens N streams through ADDR, "sim"
// serves BenchmarkProxyCPU's sim, "stallers ADDR N" are
// BenchmarkStalledBodies' clients. Each runs until its standard input
// closes.
const streamHelperEnv = "GRID_STREAM_HELPER"

func init() {
	switch os.Getenv(streamHelperEnv) {
	case "":
		return
	case "upstream":
		os.Exit(streamUpstreamHelper())
	case "clients":
		os.Exit(streamClientsHelper())
	case "sim":
		os.Exit(simHelper())
	case "stallers":
		os.Exit(stallersHelper())
	}
	os.Exit(2)
}

// BenchmarkStreamMemoryApart measures one concurrent SSE stream's cost to
// the gateway with nothing else in its process: the upstream and the
// clients are helper processes (this binary re-run), so the gateway holds
// two descriptors per stream and a 20,000-descriptor limit allows 9,900
// streams. It reports the growth of the Go heap plus goroutine stacks per
// stream (after a collection) and of the process's resident memory, and
// nginx's resident growth on the same helpers. BENCHMARKS.md has the
// figures and the command.
func BenchmarkStreamMemoryApart(b *testing.B) {
	raiseFileLimit()
	for _, n := range []int{1000, 2000, 9900} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			for range b.N {
				heap, stacks, rss := holdStreamsApart(b, n, "gateway")
				b.ReportMetric(float64(heap)/float64(n), "B/stream")
				b.ReportMetric(float64(stacks)/float64(n), "stack-B/stream")
				b.ReportMetric(float64(rss)/float64(n), "RSS-B/stream")
				if _, _, nginx := holdStreamsApart(b, n, "nginx"); nginx != 0 {
					b.ReportMetric(float64(nginx)/float64(n), "nginx-RSS-B/stream")
				}
			}
		})
	}
}

// holdStreamsApart opens n streams through the gateway (in this process)
// or nginx, and returns what holding them added: Go heap plus stacks and
// stacks alone (gateway), and resident memory (the gateway's process, or
// nginx's master and workers).
func holdStreamsApart(b *testing.B, n int, via string) (heap, stacks, rss int64) {
	b.Helper()
	upstream, upIn, upOut := startStreamHelper(b, "upstream")
	defer func() {
		upIn.Close()
		upstream.Wait()
	}()
	addr, err := upOut.ReadString('\n')
	if err != nil {
		b.Fatalf("upstream helper: %v", err)
	}
	upstreamURL := "http://" + strings.TrimSpace(addr)

	var target string
	var g *Gateway
	var before runtime.MemStats
	var rssBefore int64
	switch via {
	case "gateway":
		var stop func()
		g, target, stop = serveStreamGateway(b, upstreamURL, n)
		defer stop()
		// Memory an earlier run freed goes back to the system first, so
		// the resident growth is this run's.
		debug.FreeOSMemory()
		runtime.ReadMemStats(&before)
		rssBefore = selfRSS()
	case "nginx":
		u := startNginx(b, upstreamURL)
		if u == "" {
			return 0, 0, 0
		}
		target = strings.TrimPrefix(u, "http://")
		rssBefore = nginxRSS()
	}

	clients, in, out := startStreamHelper(b, "clients", target, strconv.Itoa(n))
	line, err := out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("clients helper: %q %v", line, err)
	}
	if g != nil {
		waitAllDetached(b, g, n)
	}
	if via == "nginx" {
		rss = nginxRSS() - rssBefore
	} else {
		runtime.GC()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		heap = int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
		stacks = int64(after.StackInuse) - int64(before.StackInuse)
		rss = selfRSS() - rssBefore
	}
	in.Close()
	clients.Wait()
	return heap, stacks, rss
}

// startStreamHelper runs this test binary as a helper with args; the
// helper stops when the returned writer is closed.
func startStreamHelper(b *testing.B, role string, args ...string) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
	b.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), streamHelperEnv+"="+role)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd, in, bufio.NewReader(out)
}

// selfRSS is this process's resident memory.
func selfRSS() int64 {
	_, rss := procStatus("self")
	return rss
}

func streamUpstreamHelper() int {
	raiseFileLimit()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	release := make(chan struct{})
	srv := &http.Server{Handler: heldStream(release)}
	go srv.Serve(ln)
	fmt.Println(ln.Addr().String())
	io.Copy(io.Discard, os.Stdin)
	close(release)
	srv.Close()
	return 0
}

func streamClientsHelper() int {
	raiseFileLimit()
	target, n, ok := helperTargetAndCount()
	if !ok {
		return 2
	}
	conns, err := openStreams(target, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// helperTargetAndCount reads a helper's first two arguments, "ADDR N".
func helperTargetAndCount() (target string, n int, ok bool) {
	if len(os.Args) < 3 {
		return "", 0, false
	}
	n, err := strconv.Atoi(os.Args[2])
	return os.Args[1], n, err == nil
}
