package gateway

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/sim"
)

// BenchmarkProxyCPU measures the CPU a proxied request costs the gateway
// and nginx, driven by wrk (a C load generator: an in-process Go client
// would share the gateway's runtime and flatter it). The sim answers from
// a helper process (this binary re-run), so this process holds the
// gateway alone and its CPU time is the gateway's; nginx's is read from
// /proc for its master and workers. Each target gets wrk with 2 threads
// and 16 connections for 5 s; the figures are CPU time per request and
// requests a second. Run with -benchtime 1x; add -cpuprofile to see
// where the gateway's time goes (BENCHMARKS.md).
func BenchmarkProxyCPU(b *testing.B) {
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		b.Skip("wrk not installed (apt-get install wrk)")
	}
	cmd, stop, out := startStreamHelper(b, "sim")
	defer func() { stop.Close(); cmd.Wait() }()
	addr, err := out.ReadString('\n')
	if err != nil {
		b.Fatalf("sim helper: %v", err)
	}
	upstream := "http://" + strings.TrimSpace(addr)
	_, gwAddr, stopGateway := serveStreamGateway(b, upstream, 4096)
	defer stopGateway()
	nginx := startNginx(b, upstream)
	for _, mode := range []struct {
		name   string
		stream bool
		tokens int
	}{{"json", false, 8}, {"sse-16", true, 16}} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":%d,"stream":%v}`, sim.DefaultModel, mode.tokens, mode.stream)
		script := filepath.Join(b.TempDir(), "post.lua")
		lua := fmt.Sprintf("wrk.method = \"POST\"\nwrk.body = %q\nwrk.headers[\"Content-Type\"] = \"application/json\"\n", body)
		if err := os.WriteFile(script, []byte(lua), 0o600); err != nil {
			b.Fatal(err)
		}
		b.Run(mode.name, func(b *testing.B) {
			for b.Loop() {
				// Warm each target's connections and pools first.
				runWrk(b, wrk, script, "http://"+gwAddr, time.Second)
				before := selfCPU()
				n, rate := runWrk(b, wrk, script, "http://"+gwAddr, 5*time.Second)
				used := selfCPU() - before
				b.ReportMetric(float64(used.Microseconds())/float64(n), "gateway-cpu-µs/req")
				b.ReportMetric(rate, "gateway-req/s")
				if nginx == "" {
					continue
				}
				runWrk(b, wrk, script, nginx, time.Second)
				before = nginxCPU()
				n, rate = runWrk(b, wrk, script, nginx, 5*time.Second)
				used = nginxCPU() - before
				b.ReportMetric(float64(used.Microseconds())/float64(n), "nginx-cpu-µs/req")
				b.ReportMetric(rate, "nginx-req/s")
			}
		})
	}
}

var (
	wrkRequests = regexp.MustCompile(`(\d+) requests in`)
	wrkRate     = regexp.MustCompile(`Requests/sec:\s+([\d.]+)`)
	wrkErrors   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)|Socket errors: .*`)
)

// runWrk runs wrk against target for d and returns the requests it
// completed and their rate; any non-2xx answer or socket error fails b.
func runWrk(b *testing.B, wrk, script, target string, d time.Duration) (int, float64) {
	b.Helper()
	out, err := exec.Command(wrk, "-t2", "-c16", "-d"+d.String(), "-s", script, target+"/v1/chat/completions").CombinedOutput()
	if err != nil {
		b.Fatalf("wrk %s: %v\n%s", target, err, out)
	}
	if m := wrkErrors.Find(out); m != nil {
		b.Fatalf("wrk %s: %s\n%s", target, m, out)
	}
	n, rate := wrkRequests.FindSubmatch(out), wrkRate.FindSubmatch(out)
	if n == nil || rate == nil {
		b.Fatalf("wrk %s: cannot read its output:\n%s", target, out)
	}
	requests, _ := strconv.Atoi(string(n[1]))
	perSecond, _ := strconv.ParseFloat(string(rate[1]), 64)
	if requests == 0 {
		b.Fatalf("wrk %s: no request completed:\n%s", target, out)
	}
	return requests, perSecond
}

// selfCPU is the user and system CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nginxCPU sums the user and system CPU time of nginx's master and workers
// (from /proc/PID/stat, in clock ticks of 10 ms).
func nginxCPU() time.Duration {
	var ticks int64
	for _, pid := range nginxProcs() {
		raw, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: state is the
		// first, utime and stime the 12th and 13th.
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// simHelper serves a sim that is never the bottleneck (1,024 slots, a
// microsecond a token) on a free port, prints its address and runs until
// its standard input closes.
func simHelper() int {
	s, err := sim.New(sim.Options{Kind: sim.KindVLLM, Slots: 1024, TTFT: time.Microsecond, TPOT: time.Microsecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: s.Handler()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go srv.Serve(ln)
	fmt.Println(ln.Addr().String())
	bufio.NewReader(os.Stdin).ReadString(0)
	srv.Close()
	return 0
}
