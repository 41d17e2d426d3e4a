// Package routeplot draws the routing benchmark's tables (internal/routesim)
// as a PNG: for each scenario, mean and p99 time in system against the age of
// the readings, one line per policy. It lives apart from the harness so that
// the harness and its tests do not carry a plotting library.
package routeplot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/grid-inference/grid/internal/routesim"
)

// palette gives each policy a colour that stays the same across panels;
// the default and the oracle are drawn thicker.
var palette = map[string]color.RGBA{
	routesim.WeightedRR:      {0x7f, 0x7f, 0x7f, 0xff},
	routesim.WeightedRandom:  {0xbc, 0xbd, 0x22, 0xff},
	routesim.LeastConn:       {0xff, 0x7f, 0x0e, 0xff},
	routesim.JSQStale:        {0xd6, 0x27, 0x28, 0xff},
	routesim.JSQStaleOwn:     {0xff, 0x98, 0x96, 0xff},
	routesim.P2CStale:        {0x94, 0x67, 0xbd, 0xff},
	routesim.P2CStaleOwn:     {0xc5, 0xb0, 0xd5, 0xff},
	routesim.Reference:       {0x8c, 0x56, 0x4b, 0xff},
	routesim.AgeAwareNoOwn:   {0x9e, 0xda, 0xe5, 0xff},
	routesim.AgeAware:        {0x1f, 0x77, 0xb4, 0xff},
	routesim.AgeAwareByShare: {0x17, 0xbe, 0xcf, 0xff},
	routesim.Latency:         {0xe3, 0x77, 0xc2, 0xff},
	routesim.Oracle:          {0x2c, 0xa0, 0x2c, 0xff},
}

// WritePNG draws tables as a grid of panels, a row per table and a column
// each for the mean and the p99, and writes the PNG to w.
func WritePNG(w io.Writer, tables []routesim.Table) error {
	if len(tables) == 0 {
		return fmt.Errorf("routeplot: no tables")
	}
	const panelW, panelH = 6.5 * vg.Inch, 4 * vg.Inch
	rows, cols := len(tables), 2
	img := vgimg.New(panelW*vg.Length(cols), panelH*vg.Length(rows))
	canvas := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter, PadY: vg.Millimeter}
	plots := make([][]*plot.Plot, rows)
	for r, t := range tables {
		plots[r] = make([]*plot.Plot, cols)
		for c, stat := range []string{"mean", "p99"} {
			p, err := panel(t, stat)
			if err != nil {
				return err
			}
			plots[r][c] = p
		}
	}
	canvases := plot.Align(plots, tiles, canvas)
	for r := range plots {
		for c := range plots[r] {
			plots[r][c].Draw(canvases[r][c])
		}
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("routeplot: write png: %w", err)
	}
	return nil
}

// panel plots one statistic of a table against the readings' age, both axes
// logarithmic: ages span two decades, and the stale policies' p99 does too.
func panel(t routesim.Table, stat string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %s", t.Scenario.Name, stat)
	p.X.Label.Text = "age of the readings T (mean request durations)"
	p.Y.Label.Text = stat + " time in system (mean request durations)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = steps(1, 2, 5), steps(1, 1.5, 2, 3, 5, 7)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())
	for _, s := range series(t, stat) {
		line, points, err := plotter.NewLinePoints(s.points)
		if err != nil {
			return nil, fmt.Errorf("routeplot: %s %s: %w", t.Scenario.Name, s.policy, err)
		}
		policy := s.policy
		line.Color, points.Color = palette[policy], palette[policy]
		line.Width = vg.Points(1.2)
		if policy == routesim.AgeAware || policy == routesim.Oracle {
			line.Width = vg.Points(2.5)
		}
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(2)
		p.Add(line, points)
		p.Legend.Add(policy, line, points)
	}
	// Headroom above the lines for the legend: the panel's top third.
	p.Y.Min = math.Min(p.Y.Min, 1)
	p.Y.Max = p.Y.Min * math.Pow(p.Y.Max/p.Y.Min, 1.6)
	return p, nil
}

// line is one policy's points in a panel.
type line struct {
	policy string
	points plotter.XYs
}

// series lists, in the harness's policy order, each policy's statistic
// against the readings' age; a value a log axis cannot show is left out.
func series(t routesim.Table, stat string) []line {
	var out []line
	for _, policy := range routesim.Policies {
		res, ok := t.Results[policy]
		if !ok {
			continue
		}
		pts := make(plotter.XYs, 0, len(res))
		for k, r := range res {
			v := r.Mean
			if stat == "p99" {
				v = r.P99
			}
			if v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
				pts = append(pts, plotter.XY{X: t.Ages[k], Y: v})
			}
		}
		out = append(out, line{policy, pts})
	}
	return out
}

// steps ticks a logarithmic axis at the given multiples of each power of
// ten, labelled: the interesting range (1 to 3 mean durations) lies inside
// one decade, where plain log ticks carry no label.
func steps(multiples ...float64) plot.Ticker {
	return plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		var ticks []plot.Tick
		for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
			for _, m := range multiples {
				// m·10^e computed as m/10^-e for negative e keeps 0.1 exact.
				v := m * math.Pow(10, e)
				if e < 0 {
					v = m / math.Pow(10, -e)
				}
				if v >= lo && v <= hi {
					ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', 3, 64)})
				}
			}
		}
		return ticks
	})
}
