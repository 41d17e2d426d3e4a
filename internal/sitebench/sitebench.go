// Package sitebench is the routing benchmark on real processes (grid bench
// sites): on loopback, N sites of `grid sim` engines, one `grid operator`
// per site and K `grid gateway` replicas per site, or K nginx instances per
// site in front of every site's engines, and an open-loop load generator
// spread over every entry point. Every router of a cell is sent the same
// seeded request sequence on fresh processes, under a scenario: steady
// load, load that bypasses the routers, capacity lost and regained, a site
// killed and restarted, every gateway restarted, or the whole grid started
// under load.
package sitebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/stats"
)

// Model is the model every sim serves.
const Model = "bench/model"

// Router is one of the routers a cell runs.
type Router struct {
	// Name is its name in --routers and in the tables.
	Name string
	// Availability is what the gateway's availability block sets beyond
	// the defaults, as the entries of a YAML flow mapping ("" for none);
	// Grid routers only.
	Availability string
	// Nginx selects nginx instead of Grid; LeastConn its least_conn
	// balancing instead of weighted round robin; LocalOnly gives each
	// instance its own site's engines alone (what staying local costs).
	Nginx, LeastConn, LocalOnly bool
	// Model runs the cell on a model of the sims under that rule instead
	// of on processes (model.go): routers no process can run, and nginx's
	// rule on the same model to read them against.
	Model ModelRule
}

// Routers are the routers --routers names.
var Routers = []Router{
	{Name: "grid"},
	{Name: "grid:reference", Availability: "policy: reference"},
	{Name: "grid:latency", Availability: "policy: latency"},
	{Name: "grid:hold", Availability: "holdWhenFull: 60s"},
	{Name: "nginx-wrr", Nginx: true},
	{Name: "nginx-least-conn", Nginx: true, LeastConn: true},
	{Name: "nginx-local", Nginx: true, LocalOnly: true},
	{Name: "model:nginx-wrr", Model: ModelWRR},
	{Name: "model:jsq", Model: ModelJSQ},
	{Name: "model:site-oracle", Model: ModelSiteOracle},
	{Name: "model:one-line", Model: ModelOneLine},
}

// Scenario is what happens during a cell.
type Scenario string

// Scenarios.
const (
	Steady       Scenario = "steady"
	ExternalLoad Scenario = "external-load"
	CapacityDrop Scenario = "capacity-drop"
	SiteFailure  Scenario = "site-failure"
	RestartAll   Scenario = "restart"
	ColdStart    Scenario = "cold-start"
	WAN          Scenario = "wan"
	// MixedPrompts: prompts from 100 to 30,000 tokens (MixedPromptSizes),
	// the sims prefilling one prompt at a time per engine, so that a long
	// prompt holds up the first token of every request behind it.
	MixedPrompts Scenario = "mixed-prompts"
)

// baselineRoute is the router every ratio is taken against.
const baselineRoute = "nginx-wrr"

// Scenarios lists every scenario, in the order the tables print them.
var Scenarios = []Scenario{Steady, ExternalLoad, CapacityDrop, SiteFailure, RestartAll, ColdStart, WAN, MixedPrompts}

// Config is one benchmark.
type Config struct {
	// Slots per site.
	Slots []int
	// Replicas is the gateway replicas (or nginx instances) per site.
	Replicas int
	Load     float64
	Arrivals Arrivals
	// Warmup is the load before measuring starts (none for cold-start);
	// Duration what is measured.
	Warmup, Duration time.Duration
	Routers          []Router
	Scenarios        []Scenario
	Runs             int
	Seed             uint64
	Timing           Timing
	// Binary is the grid binary the processes run (os.Executable()).
	Binary string
	// Log receives progress lines; nil is silent.
	Log io.Writer
	// RequestsOut, when set, is a directory that receives each cell's
	// requests, one TSV file per cell (WriteRequests).
	RequestsOut string
}

// DefaultTiming: about 1 s a request at the default sizes, a 20,000-token
// prompt a second of prefill.
var DefaultTiming = Timing{TTFT: 20 * time.Millisecond, TPOT: 5 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond, EPPRefresh: time.Second}

// Result is one cell: a scenario, a router, a run.
type Result struct {
	Scenario Scenario
	Router   string
	Run      int
	Requests int
	Errors   int
	// TTFT and E2E are the measured requests' time to first token and to
	// the end, of those that succeeded.
	TTFTP50, TTFTP99, E2EMean, E2EP99 time.Duration
	// Share is each site's part of the measured requests; Local the part
	// served by the site whose entry point took them.
	Share map[string]float64
	Local float64
	// ErrorKinds counts the failed requests by what their client saw
	// (errorKind); ErrorSample is the first few errors, for the log.
	ErrorKinds  map[string]int
	ErrorSample []string
	// ttft is every measured request's time to first token, sorted: the
	// tables pool a cell's runs into one p99 (WriteTables).
	ttft []time.Duration
	// CPUBusy is the share of the machine's CPU time busy while the load
	// ran (from /proc/stat; -1 where it cannot be read, or the cell ran on
	// the model of the sims). Near 1, the sims' timings stretch with the
	// contention and the cell measures it, not only the routing.
	CPUBusy float64
}

// errorKind is the class of what a failed request's client saw: a stream
// that ended with an error event (the gateway's terminal event, the
// stream's end told), a stream cut after it began (a broken connection,
// or an end without [DONE] a client may take for the whole answer), a
// refused or reset connection, or a status.
func errorKind(err string) string {
	switch {
	case strings.HasPrefix(err, "stream error event"):
		return "stream error event"
	case strings.HasPrefix(err, "stream"):
		return "stream cut"
	case strings.HasPrefix(err, "status "):
		return err[:len("status 000")]
	case strings.Contains(err, "connection refused"):
		return "refused"
	}
	return "transport"
}

// Run runs every scenario × router × run and returns the results in that
// order.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	for _, r := range cfg.Routers {
		if r.Model == "" && cfg.Binary == "" {
			return nil, errors.New("sitebench: no grid binary")
		}
		if r.Model != "" {
			for _, sc := range cfg.Scenarios {
				if !slices.Contains(modelScenarios, sc) {
					return nil, fmt.Errorf("sitebench: %s runs on a model of the sims, which has no %s (only %v)", r.Name, sc, modelScenarios)
				}
			}
		}
		if r.Nginx {
			if _, err := exec.LookPath(nginxBinary); err != nil {
				return nil, ErrNoNginx
			}
		}
	}
	var out []Result
	for _, sc := range cfg.Scenarios {
		for run := range max(cfg.Runs, 1) {
			for _, router := range cfg.Routers {
				if err := ctx.Err(); err != nil {
					return out, err
				}
				res, err := runCell(ctx, cfg, sc, router, run)
				if err != nil {
					return out, fmt.Errorf("%s, %s, run %d: %w", sc, router.Name, run+1, err)
				}
				if cfg.Log != nil {
					busy := "modelled"
					if res.CPUBusy >= 0 {
						busy = fmt.Sprintf("cpu busy %.0f%%", 100*res.CPUBusy)
					}
					fmt.Fprintf(cfg.Log, "%s %s run %d: %d requests, %d errors %v, ttft p50 %v p99 %v, e2e mean %v p99 %v, %s\n", sc, router.Name, run+1,
						res.Requests, res.Errors, res.ErrorKinds, res.TTFTP50, res.TTFTP99, res.E2EMean, res.E2EP99, busy)
					for _, e := range res.ErrorSample {
						fmt.Fprintf(cfg.Log, "  error: %s\n", e)
					}
				}
				out = append(out, res)
			}
		}
	}
	return out, nil
}

// runCell starts a fresh grid of processes, sends the workload, runs the
// scenario's event, and measures.
func runCell(ctx context.Context, cfg Config, sc Scenario, router Router, run int) (Result, error) {
	dir, err := os.MkdirTemp("", "grid-bench-sites-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	sites, err := newSites(cfg.Slots, cfg.Replicas)
	if err != nil {
		return Result{}, err
	}
	timing, sizes := cfg.Timing, DefaultSizes
	if sc == MixedPrompts {
		timing.SharedPrefill, sizes = true, MixedPromptSizes
	}
	slots := 0
	var entries []string
	for _, s := range sites {
		slots += s.slots
		entries = append(entries, s.replicas...)
	}
	warmup := cfg.Warmup
	if sc == ColdStart {
		warmup = 0
	}
	seed := cfg.Seed + uint64(run)*0x9E3779B97F4A7C15
	w := NewWorkload(seed, warmup+cfg.Duration, cfg.Load, slots, len(entries), cfg.Arrivals, timing, sizes)
	// The events happen to the biggest site, in the middle third.
	biggest := sites[0]
	for _, s := range sites {
		if s.slots > biggest.slots {
			biggest = s
		}
	}
	third := cfg.Duration / 3
	if router.Model != "" {
		ev := siteEvents{site: slices.Index(sites, biggest)}
		switch sc {
		case ExternalLoad:
			ev.external = externalLoad(seed, third, biggest.slots, timing, sizes).Requests
			for i := range ev.external {
				ev.external[i].At += warmup + third
			}
		case CapacityDrop:
			ev.dropAt, ev.backAt, ev.dropTo = warmup+third, warmup+2*third, max(biggest.endpoints/2, 1)
		}
		outs, err := replay(w, sites, cfg.Replicas, timing, router.Model, ev)
		if err != nil {
			return Result{}, err
		}
		return finishCell(cfg, sc, router, run, outs, warmup, -1)
	}
	st := &stack{bin: cfg.Binary, dir: dir, timing: timing, sites: sites, router: router}
	defer st.close()
	if err := st.startSims(); err != nil {
		return Result{}, err
	}
	startRouters := func() error {
		if router.Nginx {
			return st.startNginx(router.LeastConn)
		}
		return st.startGrid()
	}
	if sc == WAN {
		if err := st.startLinks(); err != nil {
			return Result{}, err
		}
	}
	gen := newGenerator(entries, sites, st.linkSites())
	// While routers start or restart, a client's connection may be
	// refused: it is sent again, as a load balancer would send it to a
	// replica that is up, and its latency counts from its arrival.
	gen.retryRefused = sc == ColdStart || sc == RestartAll
	var busy cpuMeter
	certs := dir + "/certs"
	if sc == ColdStart {
		// The load starts with the routers: the first requests find
		// processes still starting, as after a deploy.
		busy, _ = readCPU()
		loadDone := gen.start(ctx, w)
		if err := startRouters(); err != nil {
			return Result{}, err
		}
		<-loadDone
	} else {
		if err := startRouters(); err != nil {
			return Result{}, err
		}
		if err := gen.waitRouted(ctx, Model, 30*time.Second); err != nil {
			return Result{}, err
		}
		busy, _ = readCPU()
		loadDone := gen.start(ctx, w)
		at := func(d time.Duration) bool { return clock.Sleep(ctx, clock.Real{}, d) }
		var eventErr error
		switch sc {
		case ExternalLoad:
			if at(warmup + third) {
				// Clients of the biggest site send it half its capacity
				// directly, for a third of the run.
				ext := externalLoad(seed, third, biggest.slots, timing, sizes)
				direct := newGenerator([]string{biggest.sim}, sites, nil)
				direct.unmeasured = true
				<-direct.start(ctx, ext)
			}
		case CapacityDrop:
			if at(warmup + third) {
				eventErr = simControl(biggest.sim, fmt.Sprintf(`{"endpoints": %d}`, max(biggest.endpoints/2, 1)))
				if eventErr == nil && at(third) {
					eventErr = simControl(biggest.sim, fmt.Sprintf(`{"endpoints": %d}`, biggest.endpoints))
				}
			}
		case SiteFailure:
			if at(warmup + third) {
				biggest.simProc.kill()
				if at(third) {
					eventErr = st.startSim(biggest)
				}
			}
		case RestartAll:
			if at(warmup) {
				if router.Nginx {
					eventErr = st.restartNginx(router.LeastConn)
				} else {
					eventErr = st.restartGateways(certs)
				}
			}
		}
		<-loadDone
		if eventErr != nil {
			return Result{}, fmt.Errorf("the scenario's event: %w", eventErr)
		}
	}
	return finishCell(cfg, sc, router, run, gen.outcomes(), warmup, busy.since())
}

// externalLoad is the external-load scenario's requests: half the
// capacity of a site of slots, for d, from the cell's seed.
func externalLoad(seed uint64, d time.Duration, slots int, t Timing, z Sizes) Workload {
	return NewWorkload(seed^0xE7, d, 0.5, slots, 1, Poisson, t, z)
}

// finishCell summarises a cell's outcomes, with the machine's busy share
// while it ran (-1: not measured), and writes them out when asked.
func finishCell(cfg Config, sc Scenario, router Router, run int, outs []outcome, warmup time.Duration, cpuBusy float64) (Result, error) {
	res := summarise(sc, router.Name, run, outs, warmup)
	res.CPUBusy = cpuBusy
	if cfg.RequestsOut != "" {
		name := filepath.Join(cfg.RequestsOut, fmt.Sprintf("%s-%s-%d.tsv", sc, strings.ReplaceAll(router.Name, ":", "_"), run+1))
		if err := writeRequests(name, outs); err != nil {
			return res, err
		}
	}
	return res, nil
}

// writeRequests writes one line per request of a cell to file, in arrival
// order, header first: its arrival (ms from the start of load, measured
// ones from the end of the warm-up on), the site that took it and the site
// that served it, its time to first token and to the end, its sizes, and
// what its client saw when it failed.
func writeRequests(file string, outs []outcome) error {
	slices.SortFunc(outs, func(a, b outcome) int { return int(a.at - b.at) })
	var b strings.Builder
	b.WriteString("at_ms\tentry_site\tsite\tttft_ms\te2e_ms\tprompt_tokens\toutput_tokens\terror\n")
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
	}
	for _, o := range outs {
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", ms(o.at), o.entrySite, o.site, ms(o.ttft), ms(o.e2e), o.prompt, o.output, o.err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

// cpuMeter reads the machine's busy share of CPU time between two
// readings of /proc/stat.
type cpuMeter struct{ busy, total uint64 }

func readCPU() (m cpuMeter, ok bool) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return m, false
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return m, false
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return m, false
		}
		m.total += n
		if i != 3 && i != 4 { // idle and iowait
			m.busy += n
		}
	}
	return m, true
}

// since is the busy share since m was read; -1 when unreadable.
func (m cpuMeter) since() float64 {
	now, ok := readCPU()
	if !ok || m.total == 0 || now.total <= m.total {
		return -1
	}
	return float64(now.busy-m.busy) / float64(now.total-m.total)
}

// summarise measures the requests that arrived from warmup on.
func summarise(sc Scenario, router string, run int, all []outcome, warmup time.Duration) Result {
	res := Result{Scenario: sc, Router: router, Run: run, Share: map[string]float64{}, ErrorKinds: map[string]int{}}
	var ttft, e2e []time.Duration
	var sum time.Duration
	for _, o := range all {
		if o.at < warmup {
			continue
		}
		res.Requests++
		if o.err != "" {
			res.Errors++
			res.ErrorKinds[errorKind(o.err)]++
			if len(res.ErrorSample) < 3 {
				res.ErrorSample = append(res.ErrorSample, o.err)
			}
			continue
		}
		ttft = append(ttft, o.ttft)
		e2e = append(e2e, o.e2e)
		sum += o.e2e
		res.Share[o.site]++
		if o.site == o.entrySite {
			res.Local++
		}
	}
	if n := len(e2e); n > 0 {
		slices.Sort(ttft)
		slices.Sort(e2e)
		res.TTFTP50, res.TTFTP99 = quantile(ttft, 0.5), quantile(ttft, 0.99)
		res.ttft = ttft
		res.E2EMean, res.E2EP99 = sum/time.Duration(n), quantile(e2e, 0.99)
		for s := range res.Share {
			res.Share[s] /= float64(n)
		}
		res.Local /= float64(n)
	}
	return res
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[int(math.Round(q*float64(len(sorted)-1)))]
}

// WriteTSV writes one line per result, header first.
func WriteTSV(w io.Writer, results []Result) {
	fmt.Fprintln(w, "scenario\trouter\trun\trequests\terrors\tttft_p50_ms\tttft_p99_ms\te2e_mean_ms\te2e_p99_ms")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", r.Scenario, r.Router, r.Run+1, r.Requests, r.Errors, ms(r.TTFTP50), ms(r.TTFTP99), ms(r.E2EMean), ms(r.E2EP99))
	}
}

// WriteTables writes a table per scenario: each router's figures (mean ±
// 95% interval over runs), its ratio to nginx-wrr's, the TTFT p99 of all
// its runs' requests pooled and that ratio, and its share of the requests
// per site. A run of a transient (a restart, a cold start) measures a few
// hundred requests, whose p99 is the third-slowest: the pooled p99 is the
// steadier reading of a cell's tail.
func WriteTables(w io.Writer, cfg Config, results []Result) {
	for _, sc := range cfg.Scenarios {
		fmt.Fprintf(w, "scenario %s: sites %s, K=%d, load %g, %s arrivals, %v measured after %v (%d runs)\n", sc, joinInts(cfg.Slots), cfg.Replicas, cfg.Load,
			cfg.Arrivals, cfg.Duration, map[bool]time.Duration{true: 0, false: cfg.Warmup}[sc == ColdStart], max(cfg.Runs, 1))
		fmt.Fprintf(w, "  %-18s %9s %7s %16s %16s %16s %16s %10s %10s %11s %8s  %s\n", "router", "requests", "errors", "ttft p50 ms", "ttft p99 ms", "e2e mean ms", "e2e p99 ms", "p99 ttft×", "mean e2e×", "pooled p99", "pooled×", "share")
		base := cellMeans(results, sc, baselineRoute)
		for _, router := range cfg.Routers {
			m := cellMeans(results, sc, router.Name)
			if m.n == 0 {
				continue
			}
			ratio := func(a, b float64) string {
				if b == 0 {
					return "-"
				}
				return fmt.Sprintf("%.2f", a/b)
			}
			fmt.Fprintf(w, "  %-18s %9.0f %7.0f %16s %16s %16s %16s %10s %10s %11.0f %8s  %s\n", router.Name, m.requests, m.errors,
				m.ttftP50.String(), m.ttftP99.String(), m.e2eMean.String(), m.e2eP99.String(),
				ratio(m.ttftP99.mean, base.ttftP99.mean), ratio(m.e2eMean.mean, base.e2eMean.mean),
				m.pooledP99, ratio(m.pooledP99, base.pooledP99), m.share)
		}
		fmt.Fprintln(w)
	}
}

// stat is a figure's mean over runs and its 95% interval.
type stat struct{ mean, half float64 }

func (s stat) String() string {
	if s.half == 0 {
		return fmt.Sprintf("%.0f", s.mean)
	}
	return fmt.Sprintf("%.0f±%.0f", s.mean, s.half)
}

type means struct {
	n                                 int
	requests, errors                  float64
	ttftP50, ttftP99, e2eMean, e2eP99 stat
	pooledP99                         float64 // ms, over every run's requests
	share                             string
}

// cellMeans averages a scenario's runs of one router.
func cellMeans(results []Result, sc Scenario, router string) means {
	var m means
	var t50, t99, em, e99 []float64
	share := map[string]float64{}
	local := 0.0
	var pooled []time.Duration
	for _, r := range results {
		if r.Scenario != sc || r.Router != router {
			continue
		}
		pooled = append(pooled, r.ttft...)
		local += r.Local
		m.n++
		m.requests += float64(r.Requests)
		m.errors += float64(r.Errors)
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		t50, t99, em, e99 = append(t50, ms(r.TTFTP50)), append(t99, ms(r.TTFTP99)), append(em, ms(r.E2EMean)), append(e99, ms(r.E2EP99))
		for s, v := range r.Share {
			share[s] += v
		}
	}
	if m.n == 0 {
		return m
	}
	m.requests /= float64(m.n)
	m.errors /= float64(m.n)
	m.ttftP50, m.ttftP99, m.e2eMean, m.e2eP99 = interval(t50), interval(t99), interval(em), interval(e99)
	if len(pooled) > 0 {
		slices.Sort(pooled)
		m.pooledP99 = float64(quantile(pooled, 0.99)) / float64(time.Millisecond)
	}
	var names []string
	for s := range share {
		names = append(names, s)
	}
	sort.Strings(names)
	var parts []string
	for _, s := range names {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", s, 100*share[s]/float64(m.n)))
	}
	parts = append(parts, fmt.Sprintf("local %.0f%%", 100*local/float64(m.n)))
	m.share = strings.Join(parts, " ")
	return m
}

// interval is the mean of xs and the half-width of its 95% interval
// (Student's t over the runs).
func interval(xs []float64) stat {
	mean, half := stats.MeanInterval95(xs)
	return stat{mean: mean, half: half}
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, "/")
}
