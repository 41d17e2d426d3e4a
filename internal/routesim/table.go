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

// WriteTable runs every policy of a scenario over the ages and writes a
// mean/p99 table.
func WriteTable(w io.Writer, sc Scenario, ages []float64, requests int, seed uint64) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s (%d requests; mean/p99 time in system, mean service = 1)\n", sc.Name, requests)
	head := []string{"policy \\ T"}
	for _, a := range ages {
		head = append(head, fmt.Sprint(a))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, p := range Policies {
		row := []string{p}
		for _, a := range ages {
			r := Run(Config{Slots: sc.Slots, Load: sc.Load, Gateways: sc.Gateways, BoardAge: a, Requests: requests, Seed: seed, Lognormal: sc.Lognormal, Policy: p})
			row = append(row, fmt.Sprintf("%.2f/%.1f", r.Mean, r.P99))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintln(w)
}
