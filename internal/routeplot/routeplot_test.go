package routeplot

import (
	"bytes"
	"image/png"
	"testing"

	"github.com/grid-inference/grid/internal/routesim"
)

func TestWritePNGDrawsAPanelPairPerTable(t *testing.T) {
	sc := routesim.Scenarios[0]
	tables := []routesim.Table{
		routesim.RunTable(sc, []float64{0.5, 5}, 2000, 1),
		routesim.RunTable(routesim.Scenarios[1], []float64{0.5, 5}, 2000, 1),
	}
	var b bytes.Buffer
	if err := WritePNG(&b, tables); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	// Two columns (mean, p99) and a row per table, each panel wider than tall.
	size := img.Bounds().Size()
	if size.X <= size.Y/2 || size.Y < 2*size.X/4 {
		t.Errorf("image %v: want two landscape panels per row, two rows", size)
	}
	if err := WritePNG(&b, nil); err == nil {
		t.Error("no tables: want an error")
	}
}
