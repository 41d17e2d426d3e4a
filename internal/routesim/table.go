package routesim

import (
	"fmt"
	"strings"
)

// Scenario is one table: sites, load, gateways and service distribution.
type Scenario struct {
	Name     string
	Slots    []int
	Load     float64
	Gateways int
	Sigma    float64 // lognormal σ; 0 is exponential
}

// Table is one scenario's results, what the plot draws (Grid.Table):
// Results[policy][k] is the policy at Ages[k].
type Table struct {
	Scenario Scenario
	Ages     []float64
	Requests int
	Results  map[string][]Result
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, "/")
}
