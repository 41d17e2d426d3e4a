package routeplot

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"testing"

	"github.com/grid-inference/grid/internal/routesim"
)

// TestSeriesAreTheTable: each panel draws, for every policy of the table,
// exactly its cells against the ages; a cell a log axis cannot show is left
// out rather than drawn at a wrong place.
func TestSeriesAreTheTable(t *testing.T) {
	table := routesim.Table{
		Ages: []float64{0.5, 5, 50},
		Results: map[string][]routesim.Result{
			routesim.AgeAware:   {{Mean: 1.1, P99: 4}, {Mean: 1.2, P99: 5}, {Mean: 1.3, P99: 6}},
			routesim.WeightedRR: {{Mean: 1.5, P99: 7}, {Mean: math.Inf(1), P99: 8}, {Mean: 0, P99: 9}},
		},
	}
	mean := series(table, "mean")
	if len(mean) != 2 || mean[0].policy != routesim.WeightedRR || mean[1].policy != routesim.AgeAware {
		t.Fatalf("series %v, want weighted-rr then age-aware (the harness's order)", mean)
	}
	if got := mean[1].points; len(got) != 3 || got[0].X != 0.5 || got[0].Y != 1.1 || got[2].X != 50 || got[2].Y != 1.3 {
		t.Errorf("age-aware means %v", got)
	}
	if got := mean[0].points; len(got) != 1 || got[0].Y != 1.5 {
		t.Errorf("weighted-rr means %v: an infinite or zero mean must be left out", got)
	}
	if got := series(table, "p99")[0].points; len(got) != 3 || got[1].Y != 8 {
		t.Errorf("weighted-rr p99 %v", got)
	}
}

// TestWritePNGDrawsEveryPolicy: the PNG has a panel pair per table and
// every policy's line in its own colour.
func TestWritePNGDrawsEveryPolicy(t *testing.T) {
	var tables []routesim.Table
	for _, sigma := range []float64{0, 1} { // exponential and lognormal service
		g := routesim.Grid{Slots: []int{8, 16, 32}, Sigma: sigma, Scenario: routesim.ChangeNone, Phases: []routesim.Phases{routesim.PhasesRandom},
			Gateways: []int{4}, Loads: []float64{0.9}, Ages: []float64{0.5, 5}, Policies: routesim.Policies, Seeds: 1, Seed: 1, Requests: 2000}
		tables = append(tables, g.Table(g.Run()))
	}
	var b bytes.Buffer
	if err := WritePNG(&b, tables); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	// Two columns of 6.5 × 4 inch panels, one row per table.
	if size := img.Bounds().Size(); size.X*4*len(tables) != size.Y*13 {
		t.Errorf("image %v: want two 6.5 × 4 panels per row, %d rows", size, len(tables))
	}
	drawn := colours(t, &b)
	for _, policy := range routesim.Policies {
		if n := drawn[palette[policy]]; n < 50 {
			t.Errorf("policy %s: %d pixels of its colour, want its line drawn", policy, n)
		}
	}
	// The colours come from the data: a table of two policies draws those
	// two and no other.
	two := tables[0]
	two.Results = map[string][]routesim.Result{routesim.AgeAware: two.Results[routesim.AgeAware], routesim.Oracle: two.Results[routesim.Oracle]}
	if err := WritePNG(&b, []routesim.Table{two}); err != nil {
		t.Fatal(err)
	}
	drawn = colours(t, &b)
	for _, policy := range routesim.Policies {
		if policy == routesim.WeightedRR {
			continue // grey: antialiased grid lines and text have it too
		}
		n := drawn[palette[policy]]
		if want := policy == routesim.AgeAware || policy == routesim.Oracle; want != (n > 0) {
			t.Errorf("a table of age-aware and oracle: %d pixels of %s's colour", n, policy)
		}
	}
	if err := WritePNG(&b, nil); err == nil {
		t.Error("no tables: want an error")
	}
}

// colours counts the pixels of each colour of the PNG in b, and empties b.
func colours(t *testing.T, b *bytes.Buffer) map[color.RGBA]int {
	t.Helper()
	img, err := png.Decode(b)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	drawn := map[color.RGBA]int{}
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			drawn[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), uint8(a >> 8)}]++
		}
	}
	return drawn
}
