package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/config"
)

// BenchmarkStalledBodies measures the gateway's resident memory under
// clients that declare large bodies, send most of each and stall: N
// clients (a helper process) each declare a 10 MiB body, send 9 MiB and
// wait; a client refused at once (503 body_budget) tries again 50 ms
// later, and one whose body times out (limits.bodyReadTimeout, 5 s here so
// that the stalled bodies turn over several times) at once. The gateway
// has the default body budget (512 MiB) and sets its memory limit from it
// as `grid gateway` does when neither GOMEMLIMIT nor a cgroup gives one;
// it is alone in this process. It reports the process's peak resident
// memory (VmHWM) over 20 s, and its growth over the resident memory
// before the attack. BENCHMARKS.md has the figures and the command.
func BenchmarkStalledBodies(b *testing.B) {
	raiseFileLimit()
	for _, n := range []int{60, 400} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			for range b.N {
				peak, growth, limit := stallBodies(b, n, 20*time.Second)
				b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
				b.ReportMetric(float64(growth)/(1<<20), "growth-MiB")
				b.ReportMetric(float64(limit)/(1<<20), "memory-limit-MiB")
			}
		})
	}
}

// stallBodies runs n stalling clients against a fresh gateway for d and
// returns the process's peak resident memory, its growth over the
// resident memory before, and the memory limit set.
func stallBodies(b *testing.B, n int, d time.Duration) (peak, growth, limit int64) {
	old := debug.SetMemoryLimit(-1)
	debug.SetMemoryLimit(1<<63 - 1)
	limitFromBodies.Store(0)
	defer func() { debug.SetMemoryLimit(old); limitFromBodies.Store(0) }()
	limit = SetMemoryLimitFromBodies(0)
	g := benchGateway(b, "http://127.0.0.1:9")
	defer g.Close()
	addr := serveGuarded(b, g, ClientListener, func(l *config.GatewayLimits) {
		l.ClientConns = 4 * n
		l.BodyReadTimeout = config.Duration(5 * time.Second)
	})
	debug.FreeOSMemory()
	resetPeakRSS()
	before := selfRSS()
	cmd, stop, out := startStreamHelper(b, "stallers", addr, strconv.Itoa(n), d.String())
	line, err := out.ReadString('\n')
	stop.Close()
	cmd.Wait()
	if err != nil {
		b.Fatalf("stallers: %v", err)
	}
	b.Logf("%d clients: %s", n, strings.TrimSpace(line))
	peak = peakRSS()
	return peak, peak - before, limit
}

// resetPeakRSS resets this process's VmHWM to its resident memory now
// (writing 5 to clear_refs), where the kernel allows it.
func resetPeakRSS() { os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is this process's resident high-water mark, VmHWM.
func peakRSS() int64 { return procStatusFields("self")["VmHWM:"] << 10 }

// stallersHelper is BenchmarkStalledBodies' clients: "stallers ADDR N D"
// runs N clients against ADDR for D, then prints what they were answered.
func stallersHelper() int {
	raiseFileLimit()
	target, n, ok := helperTargetAndCount()
	if !ok || len(os.Args) < 4 {
		return 2
	}
	d, err := time.ParseDuration(os.Args[3])
	if err != nil {
		return 2
	}
	chunk := make([]byte, 64<<10)
	deadline := time.Now().Add(d)
	var refused, timedOut, other atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				switch stallOnce(target, chunk, deadline) {
				case http.StatusServiceUnavailable:
					refused.Add(1)
					time.Sleep(50 * time.Millisecond)
				case http.StatusRequestTimeout:
					timedOut.Add(1)
				default:
					other.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("refused %d, timed out %d, other %d\n", refused.Load(), timedOut.Load(), other.Load())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// stallOnce declares a 10 MiB body at target, sends 9 MiB of it and waits
// for the answer (until deadline), whose status it returns (0: none).
func stallOnce(target string, chunk []byte, deadline time.Time) int {
	c, err := net.Dial("tcp", target)
	if err != nil {
		return 0
	}
	defer c.Close()
	c.SetDeadline(deadline)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 10<<20)
	for sent := 0; sent < 9<<20; sent += len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			break // refused: the gateway answered and closed
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
