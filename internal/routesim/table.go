package routesim

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Scenario is one table: sites, load, gateways and service distribution.
type Scenario struct {
	Name      string
	Slots     []int
	Load      float64
	Gateways  int
	Lognormal bool
}

// Scenarios are the configurations of the routing benchmark.
var Scenarios = []Scenario{
	{Name: "sites 8/16/32, load 0.9, K=4, exponential", Slots: []int{8, 16, 32}, Load: 0.9, Gateways: 4},
	{Name: "sites 8/16/32, load 0.9, K=4, lognormal σ=1", Slots: []int{8, 16, 32}, Load: 0.9, Gateways: 4, Lognormal: true},
	{Name: "sites 8/8/16/32/64, load 0.9, K=4, exponential", Slots: []int{8, 8, 16, 32, 64}, Load: 0.9, Gateways: 4},
	{Name: "sites 8/8/16/32/64, load 0.9, K=4, lognormal σ=1", Slots: []int{8, 8, 16, 32, 64}, Load: 0.9, Gateways: 4, Lognormal: true},
}

// Ages are the board ages of the tables, in mean request durations.
var Ages = []float64{0.1, 0.5, 1, 2, 5, 10}

// Table is one scenario's results: Results[policy][k] is the policy at
// Ages[k].
type Table struct {
	Scenario Scenario
	Ages     []float64
	Requests int
	Results  map[string][]Result
}

// RunTable runs every policy of a scenario over the ages.
func RunTable(sc Scenario, ages []float64, requests int, seed uint64) Table {
	t := Table{Scenario: sc, Ages: ages, Requests: requests, Results: map[string][]Result{}}
	for _, p := range Policies {
		for _, a := range ages {
			t.Results[p] = append(t.Results[p], Run(Config{Slots: sc.Slots, Load: sc.Load, Gateways: sc.Gateways, BoardAge: a, Requests: requests, Seed: seed, Lognormal: sc.Lognormal, Policy: p}))
		}
	}
	return t
}

// Write writes the table as mean/p99 cells, one row per policy.
func (t Table) Write(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s (%d requests; mean/p99 time in system, mean service = 1)\n", t.Scenario.Name, t.Requests)
	head := []string{"policy \\ T"}
	for _, a := range t.Ages {
		head = append(head, fmt.Sprint(a))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, p := range Policies {
		row := []string{p}
		for _, r := range t.Results[p] {
			row = append(row, fmt.Sprintf("%.2f/%.1f", r.Mean, r.P99))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// Sweep is the robustness check of the default policy: loads and gateway
// counts around the benchmark's operating point.
var (
	SweepLoads    = []float64{0.7, 0.9, 0.95}
	SweepGateways = []int{1, 4, 16}
)

// WriteSweep runs the default policy and weighted round robin over loads,
// gateway counts and ages on slots, and writes the ratio of their means
// (and p99s): below 1 the default is better.
func WriteSweep(w io.Writer, slots []int, lognormal bool, loads []float64, gateways []int, ages []float64, requests int, seed uint64) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "age-aware / weighted-rr, mean and p99 time in system, sites %s (%d requests per cell)\n", joinInts(slots), requests)
	head := []string{"load", "K"}
	for _, a := range ages {
		head = append(head, fmt.Sprintf("T=%g", a))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, load := range loads {
		for _, k := range gateways {
			row := []string{fmt.Sprint(load), fmt.Sprint(k)}
			for _, a := range ages {
				cfg := Config{Slots: slots, Load: load, Gateways: k, BoardAge: a, Requests: requests, Seed: seed, Lognormal: lognormal}
				cfg.Policy = AgeAware
				aa := Run(cfg)
				cfg.Policy = WeightedRR
				rr := Run(cfg)
				row = append(row, fmt.Sprintf("%.2f/%.2f", aa.Mean/rr.Mean, aa.P99/rr.P99))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, "/")
}
