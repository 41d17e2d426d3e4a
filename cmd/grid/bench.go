package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grid-inference/grid/internal/routeplot"
	"github.com/grid-inference/grid/internal/routesim"
	"github.com/grid-inference/grid/internal/sitebench"
)

func runBench(ctx context.Context, args []string, e *env) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help") {
		fmt.Fprint(e.stdout, "Usage: grid bench <subcommand> [flags]\n\nSubcommands:\n"+
			"  routing  simulate routing policies under stale load readings and print their tables\n"+
			"  sites    run routers on real processes (grid sim, operator, gateways; nginx) under scenarios\n\n"+
			"Run 'grid bench routing --help' or 'grid bench sites --help' for their flags.\n")
		return nil
	}
	if len(args) > 0 && args[0] == "sites" {
		return runBenchSites(ctx, args[1:], e)
	}
	if len(args) == 0 || args[0] != "routing" {
		return fmt.Errorf("%w: want `grid bench routing` or `grid bench sites`", errUsage)
	}
	fs := newFlagSet("bench routing", e)
	sites := fs.String("sites", "8,16,32", "the sites' slots, comma-separated")
	loads := fs.String("load", "0.9", "offered loads (arrival rate over service capacity), comma-separated")
	gateways := fs.String("gateways", "4", "gateway counts K, comma-separated")
	phases := fs.String("phases", "random,sync,per-site", "phase modes, comma-separated: random (each gateway refreshes at its own phase), sync (all at once), per-site (each site's reading at its own phase, seen by every gateway)")
	ages := fs.String("ages", "0.1,0.5,1,2,5,10", "board ages T in mean request durations, comma-separated")
	service := fs.String("service", "exp", "service times: exp, or lognormal[:SIGMA] (σ 1 by default)")
	sizes := fs.String("sizes", "", "lognormal[:SIGMA]: service times lognormal of that σ (1 by default), each request's told to the gateways as its size (max_tokens), which the latency policy weighs its own sends by; in place of --service")
	rtt := fs.Float64("rtt", 0, "the round trip, in mean request durations, from each gateway to every site but its own (gateway k's is site k mod the sites); 0: none, and no gateway has a site of its own")
	declare := fs.Bool("declare", false, "each site's operator relays the most its engines run at once (slots over endpoints of 8), as one configured with maxRunning does; off, the gateways learn every limit from the readings")
	scenario := fs.String("scenario", "none", "one of: "+summariseChanges())
	policies := fs.String("policies", strings.Join(routesim.Policies, ","), "policies, comma-separated")
	seeds := fs.Int("seeds", 1, "seeds per cell; above one, the mean carries its 95% interval")
	seed := fs.Uint64("seed", 7, "the first seed")
	requests := fs.Int("requests", 100_000, "requests per run")
	format := fs.String("format", "text", "text (a table per phase mode, K and load), tsv (a line per cell) or ratio (each policy over weighted-rr in the same cell; --policies must include weighted-rr)")
	quick := fs.Bool("quick", false, "a subset that runs in seconds: random phases, ages 0.5,2,10, 20000 requests")
	plotPath := fs.String("plot", "", "also write a PNG of mean and p99 against staleness per policy (the first phase mode, K and load) to this file")
	if err := parseFlags(e, fs, args[1:]); err != nil {
		return err
	}
	if *sizes != "" {
		if *service != "exp" {
			return fmt.Errorf("%w: bench routing: --sizes sets the service times: drop --service", errUsage)
		}
		*service = *sizes
	}
	g, err := benchGrid(*sites, *loads, *gateways, *phases, *ages, *service, *scenario, *policies, *seeds, *seed, *requests)
	if err != nil {
		return fmt.Errorf("%w: bench routing: %v", errUsage, err)
	}
	if *sizes != "" && g.Sigma == 0 {
		return fmt.Errorf("%w: bench routing: --sizes %q: want lognormal[:SIGMA]", errUsage, *sizes)
	}
	if !(*rtt >= 0 && *rtt < 100) {
		return fmt.Errorf("%w: bench routing: --rtt %v: want a round trip in [0, 100) mean durations", errUsage, *rtt)
	}
	g.Sizes, g.RTT, g.Declare = *sizes != "", *rtt, *declare
	switch {
	case *format != "text" && *format != "tsv" && *format != "ratio":
		return fmt.Errorf("%w: bench routing: --format %q: want text, tsv or ratio", errUsage, *format)
	case *format == "ratio" && !slices.Contains(g.Policies, routesim.WeightedRR):
		return fmt.Errorf("%w: bench routing: --format ratio divides by %s: add it to --policies", errUsage, routesim.WeightedRR)
	}
	if *quick {
		g.Phases, g.Ages, g.Requests = []routesim.Phases{routesim.PhasesRandom}, []float64{0.5, 2, 10}, 20_000
	}
	cells := g.Run()
	switch *format {
	case "text":
		g.WriteText(e.stdout, cells)
	case "tsv":
		routesim.WriteTSV(e.stdout, cells)
	case "ratio":
		g.WriteRatios(e.stdout, cells, routesim.WeightedRR)
	}
	if *plotPath != "" {
		var png bytes.Buffer
		if err := routeplot.WritePNG(&png, []routesim.Table{g.Table(cells)}); err != nil {
			return err
		}
		if err := os.WriteFile(*plotPath, png.Bytes(), 0o644); err != nil {
			return fmt.Errorf("bench routing: %w", err)
		}
		fmt.Fprintf(e.stdout, "wrote %s\n", *plotPath)
	}
	return nil
}

// positiveInt reads a count of at least 1.
func positiveInt(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err == nil && n < 1 {
		err = errors.New("below 1")
	}
	return n, err
}

// benchGrid reads the routing benchmark's flags into a grid, naming the
// flag of any value it cannot use.
func benchGrid(sites, loads, gateways, phases, ages, service, scenario, policies string, seeds int, seed uint64, requests int) (routesim.Grid, error) {
	g := routesim.Grid{Seeds: seeds, Seed: seed, Requests: requests, Scenario: routesim.Change(scenario)}
	var err error
	if g.Slots, err = list(sites, "--sites", positiveInt); err != nil {
		return g, err
	}
	if g.Loads, err = list(loads, "--load", func(s string) (float64, error) {
		x, err := strconv.ParseFloat(s, 64)
		if err == nil && (x <= 0 || x >= 1) {
			err = errors.New("want a load in (0, 1)")
		}
		return x, err
	}); err != nil {
		return g, err
	}
	if g.Gateways, err = list(gateways, "--gateways", positiveInt); err != nil {
		return g, err
	}
	if g.Phases, err = list(phases, "--phases", func(s string) (routesim.Phases, error) {
		if !slices.Contains(routesim.AllPhases, routesim.Phases(s)) {
			return "", fmt.Errorf("want one of %v", routesim.AllPhases)
		}
		return routesim.Phases(s), nil
	}); err != nil {
		return g, err
	}
	if g.Ages, err = list(ages, "--ages", func(s string) (float64, error) {
		x, err := strconv.ParseFloat(s, 64)
		if err == nil && x <= 0 {
			err = errors.New("want an age above 0")
		}
		return x, err
	}); err != nil {
		return g, err
	}
	if g.Policies, err = list(policies, "--policies", func(s string) (string, error) {
		if !slices.Contains(routesim.Policies, s) {
			return "", fmt.Errorf("want one of %s", strings.Join(routesim.Policies, ", "))
		}
		return s, nil
	}); err != nil {
		return g, err
	}
	switch kind, sigma, hasSigma := strings.Cut(service, ":"); {
	case kind == "exp" && !hasSigma:
	case kind == "lognormal" && !hasSigma:
		g.Sigma = 1
	case kind == "lognormal":
		if g.Sigma, err = strconv.ParseFloat(sigma, 64); err != nil || g.Sigma <= 0 {
			return g, fmt.Errorf("--service %q: want a σ above 0", service)
		}
	default:
		return g, fmt.Errorf("--service %q: want exp or lognormal[:SIGMA]", service)
	}
	if !slices.Contains(routesim.Changes, g.Scenario) {
		return g, fmt.Errorf("--scenario %q: want one of %v", scenario, routesim.Changes)
	}
	if seeds < 1 || requests < 100 {
		return g, fmt.Errorf("--seeds %d, --requests %d: want at least 1 seed and 100 requests", seeds, requests)
	}
	return g, nil
}

// list parses a comma-separated flag value with parse, naming the flag and
// the item it refuses.
func list[T any](v, flag string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, item := range strings.Split(v, ",") {
		x, err := parse(strings.TrimSpace(item))
		if err != nil {
			return nil, fmt.Errorf("%s %q: %v", flag, item, err)
		}
		out = append(out, x)
	}
	return out, nil
}

// runBenchSites is grid bench sites: the routers on real processes.
func runBenchSites(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("bench sites", e)
	slots := fs.String("slots", "8,16,32", "each site's slots, comma-separated (one engine per 8 slots)")
	replicas := fs.Int("replicas", 1, "gateway replicas (or nginx instances) per site, K")
	load := fs.Float64("load", 0.85, "offered load: arrival rate over the grid's service rate")
	arrivals := fs.String("arrivals", "poisson", "poisson, or bursty (on/off: a third of the time at 3× the mean rate)")
	warmup := fs.Duration("warmup", 10*time.Second, "load before measuring starts (cold-start has none)")
	duration := fs.Duration("duration", 30*time.Second, "what each cell measures: at the default 1 s scrape and poll, 20 reading refreshes and more")
	routers := fs.String("routers", "grid,nginx-wrr", "routers, comma-separated: grid (the default policy), grid:reference, grid:latency, grid:hold (the default holding requests while the grid is full), nginx-wrr (nginx weighted by slots), nginx-least-conn, nginx-local; on a model of the sims instead of processes (steady, mixed-prompts, external-load and capacity-drop only): model:nginx-wrr, model:jsq (exact fewest per slot), model:site-oracle (the soonest first token from every engine's exact state), model:one-line (the grid's slots as one line)")
	scenarios := fs.String("scenarios", "steady", "scenarios, comma-separated: "+joinScenarios())
	runs := fs.Int("runs", 1, "runs per cell; above one, each figure carries its 95% interval")
	seed := fs.Uint64("seed", 7, "the workload's seed (run n adds n)")
	format := fs.String("format", "text", "text (a table per scenario) or tsv (a line per scenario, router and run)")
	eppRefresh := fs.Duration("epp-refresh", sitebench.DefaultTiming.EPPRefresh, "how often each site's EPP recomputes its pool gauges (the real EPP's default is 5s)")
	tpot := fs.Duration("tpot", sitebench.DefaultTiming.TPOT, "the sims' time per output token; the arrival rate follows, so a longer one sends fewer requests and tokens a second at the same load")
	requestsOut := fs.String("requests-out", "", "a directory that receives every cell's requests, one TSV file per cell (arrival, entry and serving site, TTFT, end to end, sizes, error)")
	if err := parseFlags(e, fs, args); err != nil {
		return err
	}
	timing := sitebench.DefaultTiming
	timing.EPPRefresh, timing.TPOT = *eppRefresh, *tpot
	cfg := sitebench.Config{Replicas: *replicas, Load: *load, Arrivals: sitebench.Arrivals(*arrivals), Warmup: *warmup, Duration: *duration,
		Runs: *runs, Seed: *seed, Timing: timing, Log: e.stderr, RequestsOut: *requestsOut}
	bad := func(flag string, err error) error {
		return fmt.Errorf("%w: bench sites: --%s: %v", errUsage, flag, err)
	}
	for _, f := range strings.Split(*slots, ",") {
		n, err := positiveInt(strings.TrimSpace(f))
		if err != nil {
			return bad("slots", err)
		}
		cfg.Slots = append(cfg.Slots, n)
	}
	for _, name := range strings.Split(*routers, ",") {
		i := slices.IndexFunc(sitebench.Routers, func(r sitebench.Router) bool { return r.Name == strings.TrimSpace(name) })
		if i < 0 {
			return bad("routers", fmt.Errorf("%q is not one of %s", name, routerNames()))
		}
		cfg.Routers = append(cfg.Routers, sitebench.Routers[i])
	}
	for _, name := range strings.Split(*scenarios, ",") {
		sc := sitebench.Scenario(strings.TrimSpace(name))
		if !slices.Contains(sitebench.Scenarios, sc) {
			return bad("scenarios", fmt.Errorf("%q is not one of %s", name, joinScenarios()))
		}
		cfg.Scenarios = append(cfg.Scenarios, sc)
	}
	switch {
	case cfg.Arrivals != sitebench.Poisson && cfg.Arrivals != sitebench.Bursty:
		return bad("arrivals", fmt.Errorf("%q: want poisson or bursty", *arrivals))
	case *replicas < 1:
		return bad("replicas", errors.New("below 1"))
	case !(*load > 0 && *load < 2):
		return bad("load", fmt.Errorf("%v: want a load in (0, 2)", *load))
	case *tpot <= 0:
		return bad("tpot", fmt.Errorf("%v: want a positive duration", *tpot))
	case *format != "text" && *format != "tsv":
		return bad("format", fmt.Errorf("%q: want text or tsv", *format))
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench sites: the grid binary: %w", err)
	}
	cfg.Binary = bin
	results, err := sitebench.Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("bench sites: %w", err)
	}
	if *format == "tsv" {
		sitebench.WriteTSV(e.stdout, results)
	} else {
		sitebench.WriteTables(e.stdout, cfg, results)
	}
	return nil
}

// routerNames lists the routers --routers takes, from sitebench's table.
func routerNames() string {
	names := make([]string, len(sitebench.Routers))
	for i, r := range sitebench.Routers {
		names[i] = r.Name
	}
	return strings.Join(names, ", ")
}

// summariseChanges names every scenario of the routing harness with what
// it does.
func summariseChanges() string {
	names := make([]string, len(routesim.Changes))
	for i, c := range routesim.Changes {
		names[i] = fmt.Sprintf("%s (%s)", c, c.Summary())
	}
	return strings.Join(names, ", ")
}

func joinScenarios() string {
	names := make([]string, len(sitebench.Scenarios))
	for i, s := range sitebench.Scenarios {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}
