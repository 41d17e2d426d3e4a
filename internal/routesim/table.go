package routesim

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Scenario is one table: sites, load, gateways and service distribution.
type Scenario struct {
	Name     string
	Slots    []int
	Load     float64
	Gateways int
	Sigma    float64 // lognormal σ; 0 is exponential
}

// Scenarios are the configurations of the routing benchmark.
var Scenarios = []Scenario{
	{Name: "sites 8/16/32, load 0.9, K=4, exponential", Slots: []int{8, 16, 32}, Load: 0.9, Gateways: 4},
	{Name: "sites 8/16/32, load 0.9, K=4, lognormal σ=1", Slots: []int{8, 16, 32}, Load: 0.9, Gateways: 4, Sigma: 1},
	{Name: "sites 8/8/16/32/64, load 0.9, K=4, exponential", Slots: []int{8, 8, 16, 32, 64}, Load: 0.9, Gateways: 4},
	{Name: "sites 8/8/16/32/64, load 0.9, K=4, lognormal σ=1", Slots: []int{8, 8, 16, 32, 64}, Load: 0.9, Gateways: 4, Sigma: 1},
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
			t.Results[p] = append(t.Results[p], Run(Config{Slots: sc.Slots, Load: sc.Load, Gateways: sc.Gateways, BoardAge: a, Requests: requests, Seed: seed, Sigma: sc.Sigma, Policy: p}))
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

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, "/")
}
