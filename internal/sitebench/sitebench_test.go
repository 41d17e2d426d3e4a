package sitebench

import (
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWorkloadIsSeededAndLoaded: one seed gives one sequence; the arrival
// rate offers the asked load of the sims' capacity; sizes are heavy-tailed
// around their medians.
func TestWorkloadIsSeededAndLoaded(t *testing.T) {
	a := NewWorkload(7, 10*time.Minute, 0.8, 56, 3, Poisson, DefaultTiming, DefaultSizes)
	b := NewWorkload(7, 10*time.Minute, 0.8, 56, 3, Poisson, DefaultTiming, DefaultSizes)
	if len(a.Requests) != len(b.Requests) || a.Requests[100] != b.Requests[100] {
		t.Fatal("one seed, two sequences")
	}
	if c := NewWorkload(8, 10*time.Minute, 0.8, 56, 3, Poisson, DefaultTiming, DefaultSizes); c.Requests[100] == a.Requests[100] {
		t.Error("another seed, the same sequence")
	}
	var busy time.Duration
	var prompts []int
	entries := map[int]int{}
	for _, r := range a.Requests {
		busy += DefaultTiming.service(r)
		prompts = append(prompts, r.PromptTokens)
		entries[r.Entry]++
	}
	if offered := busy.Seconds() / (10 * time.Minute).Seconds() / 56; math.Abs(offered-0.8) > 0.05 {
		t.Errorf("offered load %.3f, want 0.8", offered)
	}
	if s := a.MeanService; s < 800*time.Millisecond || s > 1500*time.Millisecond {
		t.Errorf("mean service %v, want about a second", s)
	}
	long := 0
	for _, p := range prompts {
		if p > 4000 {
			long++
		}
	}
	if share := float64(long) / float64(len(prompts)); share < 0.005 || share > 0.05 {
		t.Errorf("prompts over 4,000 tokens: %.3f of requests, want a heavy tail (about 1%%)", share)
	}
	for e := range 3 {
		if n := entries[e]; n < len(a.Requests)/4 {
			t.Errorf("entry %d took %d of %d requests", e, n, len(a.Requests))
		}
	}
}

// TestBurstyArrivalsComeInBursts: the same mean rate, in on thirds.
func TestBurstyArrivalsComeInBursts(t *testing.T) {
	p := NewWorkload(3, 10*time.Minute, 0.8, 56, 1, Poisson, DefaultTiming, DefaultSizes)
	b := NewWorkload(3, 10*time.Minute, 0.8, 56, 1, Bursty, DefaultTiming, DefaultSizes)
	if r := float64(len(b.Requests)) / float64(len(p.Requests)); r < 0.85 || r > 1.15 {
		t.Errorf("bursty has %d requests to Poisson's %d: the mean rate moved", len(b.Requests), len(p.Requests))
	}
	// Bursts: most quarter-seconds are empty (the off two thirds), where a
	// Poisson stream of 40 a second almost never leaves one empty.
	empty := func(w Workload) float64 {
		full := map[int]bool{}
		for _, r := range w.Requests {
			full[int(r.At/(250*time.Millisecond))] = true
		}
		return 1 - float64(len(full))/float64(10*time.Minute/(250*time.Millisecond))
	}
	if e := empty(b); e < 0.5 {
		t.Errorf("bursty: %.2f of quarter-seconds empty, want most", e)
	}
	if e := empty(p); e > 0.05 {
		t.Errorf("Poisson: %.2f of quarter-seconds empty", e)
	}
}

// TestNginxConfigWeighsBySlots: nginx gets every site's engines, weighted
// by slots, SSE unbuffered, bodies in memory, its entry address shared
// with a replacement (reuseport) beside one of its own, and least_conn
// only when asked; a local-only instance gets its own site's engines
// alone.
func TestNginxConfigWeighsBySlots(t *testing.T) {
	st := &stack{sites: []*site{{name: "s0", slots: 8, sim: "127.0.0.1:1"}, {name: "s1", slots: 32, sim: "127.0.0.1:2"}}}
	c := nginxConfig(st.nginxUpstreams(st.sites[0]), "127.0.0.1:3", "127.0.0.1:4", "/tmp/x", false)
	for _, want := range []string{"server 127.0.0.1:1 weight=8;", "server 127.0.0.1:2 weight=32;", "listen 127.0.0.1:3 reuseport;", "listen 127.0.0.1:4;", "proxy_buffering off;", "client_body_buffer_size 4m;", "add_header X-Upstream $upstream_addr"} {
		if !strings.Contains(c, want) {
			t.Errorf("config lacks %q:\n%s", want, c)
		}
	}
	if strings.Contains(c, "least_conn") || !strings.Contains(nginxConfig(st.nginxUpstreams(st.sites[0]), "127.0.0.1:3", "127.0.0.1:4", "/tmp/x", true), "least_conn;") {
		t.Error("least_conn where not asked, or missing where asked")
	}
	st.router.LocalOnly = true
	if got := st.nginxUpstreams(st.sites[1]); len(got) != 1 || got[0] != (upstream{"127.0.0.1:2", 32}) {
		t.Errorf("local-only upstreams of s1: %v, want s1's sim alone", got)
	}
}

// TestWANLinks: every way between two sites crosses a delaying proxy,
// the delays spread over 30-80 ms by pair, the same both ways; a site
// reaches its own addresses directly, and the generator can tell which
// site a link leads to.
func TestWANLinks(t *testing.T) {
	if got := []time.Duration{wanDelay(0, 1, 3), wanDelay(0, 2, 3), wanDelay(1, 2, 3)}; got[0] != 30*time.Millisecond || got[1] != 55*time.Millisecond || got[2] != 80*time.Millisecond {
		t.Errorf("delays of three sites %v, want 30, 55, 80 ms", got)
	}
	sites, err := newSites([]int{8, 16, 32}, 1)
	if err != nil {
		t.Fatal(err)
	}
	st := &stack{sites: sites}
	defer st.close()
	if err := st.startLinks(); err != nil {
		t.Fatal(err)
	}
	a, b := sites[0], sites[2]
	if st.reach(a, a, a.sim) != a.sim {
		t.Error("a site reaches its own sim through a link")
	}
	via := st.reach(a, b, b.sim)
	if via == b.sim || st.reach(b, a, a.sim) == a.sim || st.reach(a, b, b.hops[0]) == b.hops[0] || st.reach(a, b, b.signals) == b.signals {
		t.Error("a way between two sites does not cross a link")
	}
	if st.links[link{a.name, b.name, b.sim}].Addr() != via {
		t.Error("reach and the link disagree")
	}
	if name := st.linkSites()[via]; name != b.name {
		t.Errorf("the link to %s's sim leads to %q", b.name, name)
	}
	for _, u := range st.nginxUpstreams(a) {
		if u.weight != a.slots && u.addr == st.sites[1].sim {
			t.Errorf("nginx at %s reaches s1's sim directly", a.name)
		}
	}
}

func TestIntervalIsStudents(t *testing.T) {
	s := interval([]float64{1, 2, 3})
	if s.mean != 2 || math.Abs(s.half-4.303*math.Sqrt(1.0/3)) > 1e-9 {
		t.Errorf("interval %+v", s)
	}
	if one := interval([]float64{5}); one.half != 0 || one.mean != 5 {
		t.Errorf("one run: %+v", one)
	}
}

func TestErrorKinds(t *testing.T) {
	for err, want := range map[string]string{
		"stream: unexpected EOF":                 "stream cut",
		"stream ended without [DONE]":            "stream cut",
		"stream error event: stream_interrupted": "stream error event",
		"status 503: no healthy site":            "status 503",
		"transport: Post \"http://x\": dial tcp 127.0.0.1:1: connect: connection refused": "refused",
		"transport: Post \"http://x\": EOF":                                               "transport",
	} {
		if got := errorKind(err); got != want {
			t.Errorf("errorKind(%q) = %q, want %q", err, got, want)
		}
	}
}

// TestCPUMeterReadsTheMachine: busy time over a spin of this process is a
// share in (0, 1].
func TestCPUMeterReadsTheMachine(t *testing.T) {
	m, ok := readCPU()
	if !ok {
		t.Skip("no /proc/stat")
	}
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
	}
	if b := m.since(); b <= 0 || b > 1 {
		t.Errorf("busy share over a spin: %v, want in (0, 1]", b)
	}
}

// TestFreeAddrStaysBelowTheEphemeralRange: children's ports are never
// ones an outgoing connection could take meanwhile, and successive ones
// differ.
func TestFreeAddrStaysBelowTheEphemeralRange(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(a)
		if p, _ := strconv.Atoi(port); p < firstChildPort || p > lastChildPort {
			t.Errorf("port %d outside %d-%d", p, firstChildPort, lastChildPort)
		}
		if seen[a] {
			t.Errorf("%s handed out twice", a)
		}
		seen[a] = true
	}
}

func TestStreamErrorEventIsRead(t *testing.T) {
	for data, want := range map[string]string{
		// The gateway's terminal event (docs/gateway.md).
		`{"error":{"message":"the upstream's connection broke before the answer was complete","type":"server_error","code":"stream_interrupted"}}`: "stream_interrupted",
		`{"error":{"message":"overloaded","type":"server_error","code":null}}`:                                                                     "unknown",
		`{"id":"x","choices":[{"delta":{"content":"{\"error\""}}]}`:                                                                                "",
		`{"error"`: "",
	} {
		code, ok := streamErrorCode([]byte(data))
		if code != want || ok != (want != "") {
			t.Errorf("streamErrorCode(%s) = %q, %v; want %q", data, code, ok, want)
		}
	}
}

// TestTablesPoolTheRunsTail: a cell's pooled TTFT p99 is that of every
// run's requests together, not the mean of the runs' p99s. Two runs of a
// hundred requests, 1-100 ms and 101-200 ms: the runs' p99s are 99 and
// 199 ms (mean 149), the pooled p99 of the two hundred is 198 ms;
// nginx-wrr's runs, half as slow, pool to 99 ms: 2.00×.
func TestTablesPoolTheRunsTail(t *testing.T) {
	ms := func(from, to int, scale time.Duration) []time.Duration {
		var d []time.Duration
		for i := from; i <= to; i++ {
			d = append(d, time.Duration(i)*scale)
		}
		return d
	}
	var results []Result
	for run, r := range []struct {
		router string
		ttft   []time.Duration
	}{
		{"grid", ms(1, 100, time.Millisecond)},
		{"grid", ms(101, 200, time.Millisecond)},
		{"nginx-wrr", ms(1, 100, time.Millisecond/2)},
		{"nginx-wrr", ms(101, 200, time.Millisecond/2)},
	} {
		results = append(results, summarise(Steady, r.router, run%2, outcomes(r.ttft), 0))
	}
	var out strings.Builder
	WriteTables(&out, Config{Slots: []int{8}, Routers: []Router{{Name: "grid"}, {Name: "nginx-wrr"}}, Scenarios: []Scenario{Steady}, Runs: 2}, results)
	rows := map[string][]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "grid" || f[0] == "nginx-wrr") {
			rows[f[0]] = f
		}
	}
	// router requests errors p50 p99 mean e2e-p99 p99× mean× pooled pooled× share...
	if g := rows["grid"]; len(g) < 11 || g[4] != "149±635" || g[9] != "198" || g[10] != "2.00" {
		t.Errorf("grid's row %q: want the runs' p99 149±635 ms, pooled 198 ms, pooled 2.00× nginx-wrr's\n%s", g, out.String())
	}
	if n := rows["nginx-wrr"]; len(n) < 11 || n[9] != "99" {
		t.Errorf("nginx-wrr's row %q: want pooled 99 ms\n%s", n, out.String())
	}
}

// outcomes are answered requests of the given times to first token.
func outcomes(ttft []time.Duration) []outcome {
	var outs []outcome
	for _, d := range ttft {
		outs = append(outs, outcome{ttft: d, e2e: d, site: "s0", entrySite: "s0"})
	}
	return outs
}
