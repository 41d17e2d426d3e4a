package routesim

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/grid-inference/grid/internal/stats"
)

// Grid is a set of experiments: every combination of its phase modes,
// gateway counts, loads, board ages and policies, each run over Seeds seeds.
type Grid struct {
	Slots []int
	Sigma float64
	// Sizes and RTT are Config's: every gateway told each request's
	// size, and the round trip to sites but a gateway's own.
	Sizes    bool
	RTT      float64
	Declare  bool
	Scenario Change
	Phases   []Phases
	Gateways []int
	Loads    []float64
	Ages     []float64
	Policies []string
	Seeds    int
	Seed     uint64 // the first seed; the others follow it
	Requests int
}

// Cell is one experiment over the grid's seeds: the mean time in system
// with the half-width of its 95% interval (0 with one seed), and the mean
// of the seeds' p99s.
type Cell struct {
	Policy   string
	Phases   Phases
	Gateways int
	Load     float64
	T        float64
	Mean     float64
	MeanCI   float64
	P99      float64
	// WaitP99 is the mean of the seeds' p99 waits before service (the
	// time to first token); Local the mean share served at the site of
	// the gateway that took them (with a round trip).
	WaitP99, Local float64
}

// Run runs every cell, the seeds of all cells spread over the CPUs, and
// returns the cells in table order: phases, gateways, load, policy, T.
func (g Grid) Run() []Cell {
	var cells []Cell
	for _, ph := range g.Phases {
		for _, k := range g.Gateways {
			for _, load := range g.Loads {
				for _, p := range g.Policies {
					for _, T := range g.Ages {
						cells = append(cells, Cell{Policy: p, Phases: ph, Gateways: k, Load: load, T: T})
					}
				}
			}
		}
	}
	seeds := max(g.Seeds, 1)
	results := make([][]Result, len(cells))
	for i := range results {
		results[i] = make([]Result, seeds)
	}
	type job struct{ cell, seed int }
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				c := cells[j.cell]
				results[j.cell][j.seed] = Run(Config{Slots: g.Slots, Load: c.Load, Gateways: c.Gateways, BoardAge: c.T, Phases: c.Phases,
					Requests: g.Requests, Seed: g.Seed + uint64(j.seed), Sigma: g.Sigma, Sizes: g.Sizes, RTT: g.RTT, Declare: g.Declare, Scenario: g.Scenario, Policy: c.Policy})
			}
		}()
	}
	for i := range cells {
		for s := range seeds {
			jobs <- job{i, s}
		}
	}
	close(jobs)
	wg.Wait()
	for i := range cells {
		cells[i].Mean, cells[i].MeanCI, cells[i].P99, cells[i].WaitP99, cells[i].Local = summarise(results[i])
	}
	return cells
}

// summarise returns the mean of the runs' means with the half-width of its
// 95% interval (Student's t), and the means of their p99s, p99 waits and
// local shares.
func summarise(rs []Result) (mean, ci, p99, waitP99, local float64) {
	means := make([]float64, len(rs))
	for i, r := range rs {
		means[i] = r.Mean
		p99 += r.P99
		waitP99 += r.WaitP99
		local += r.Local
	}
	mean, ci = stats.MeanInterval95(means)
	n := float64(len(rs))
	return mean, ci, p99 / n, waitP99 / n, local / n
}

// WriteTSV writes one line per cell after a header: policy, phases,
// gateways, load, T, mean, the half-width of its 95% interval, p99, the
// p99 wait before service, and the share served locally (0 without a
// round trip).
func WriteTSV(w io.Writer, cells []Cell) {
	fmt.Fprintln(w, "policy\tphases\tgateways\tload\tT\tmean\tmean_ci\tp99\twait_p99\tlocal")
	for _, c := range cells {
		fmt.Fprintf(w, "%s\t%s\t%d\t%g\t%g\t%.4f\t%.4f\t%.3f\t%.3f\t%.3f\n", c.Policy, c.Phases, c.Gateways, c.Load, c.T, c.Mean, c.MeanCI, c.P99, c.WaitP99, c.Local)
	}
}

// WriteText writes one table per phase mode, gateway count and load: a row
// per policy, a column per board age, cells "mean±ci/p99".
func (g Grid) WriteText(w io.Writer, cells []Cell) {
	service := "exponential"
	if g.Sigma > 0 {
		service = fmt.Sprintf("lognormal σ=%g", g.Sigma)
	}
	for len(cells) > 0 {
		head := cells[0]
		n := 0
		for n < len(cells) && cells[n].Phases == head.Phases && cells[n].Gateways == head.Gateways && cells[n].Load == head.Load {
			n++
		}
		block := cells[:n]
		cells = cells[n:]
		fmt.Fprintf(w, "sites %s, load %g, K=%d, phases %s, %s, scenario %s (%d requests × %d seeds; mean±95%% interval/p99 time in system, mean service = 1)\n",
			joinInts(g.Slots), head.Load, head.Gateways, head.Phases, service, g.Scenario, g.Requests, max(g.Seeds, 1))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		row := []string{"policy \\ T"}
		for _, a := range g.Ages {
			row = append(row, fmt.Sprint(a))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		for len(block) > 0 {
			row = []string{block[0].Policy}
			m := 0
			for m < len(block) && block[m].Policy == block[0].Policy {
				c := block[m]
				row = append(row, fmt.Sprintf("%.2f±%.2f/%.1f", c.Mean, c.MeanCI, c.P99))
				m++
			}
			block = block[m:]
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
}

// Table returns the first phase mode, gateway count and load of cells as a
// Table (for the plot).
func (g Grid) Table(cells []Cell) Table {
	t := Table{Ages: g.Ages, Requests: g.Requests, Results: map[string][]Result{}}
	if len(cells) == 0 {
		return t
	}
	head := cells[0]
	t.Scenario = Scenario{Name: fmt.Sprintf("sites %s, load %g, K=%d, phases %s", joinInts(g.Slots), head.Load, head.Gateways, head.Phases),
		Slots: g.Slots, Load: head.Load, Gateways: head.Gateways, Sigma: g.Sigma}
	for _, c := range cells {
		if c.Phases == head.Phases && c.Gateways == head.Gateways && c.Load == head.Load {
			t.Results[c.Policy] = append(t.Results[c.Policy], Result{Mean: c.Mean, P99: c.P99})
		}
	}
	return t
}

// WriteRatios writes, for each policy other than base, its mean and p99
// over base's in the same cell: a table per policy, a line per load, gateway
// count and phase mode, a column per board age, cells "mean/p99". A cell
// whose mean is worse than base's beyond both 95% intervals is marked "*".
// It writes nothing for a policy when cells hold no base to divide by.
func (g Grid) WriteRatios(w io.Writer, cells []Cell, base string) {
	type key struct {
		policy   string
		phases   Phases
		gateways int
		load     float64
		t        float64
	}
	byKey := map[key]Cell{}
	for _, c := range cells {
		byKey[key{c.Policy, c.Phases, c.Gateways, c.Load, c.T}] = c
	}
	service := "exponential"
	if g.Sigma > 0 {
		service = fmt.Sprintf("lognormal σ=%g", g.Sigma)
	}
	for _, p := range g.Policies {
		if p == base {
			continue
		}
		fmt.Fprintf(w, "%s / %s, mean/p99 time in system, sites %s, %s, scenario %s (%d requests × %d seeds; * worse beyond both 95%% intervals)\n",
			p, base, joinInts(g.Slots), service, g.Scenario, g.Requests, max(g.Seeds, 1))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		row := []string{"load", "K", "phases"}
		for _, a := range g.Ages {
			row = append(row, fmt.Sprintf("T=%g", a))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		for _, load := range g.Loads {
			for _, k := range g.Gateways {
				for _, ph := range g.Phases {
					row = []string{fmt.Sprint(load), fmt.Sprint(k), string(ph)}
					for _, a := range g.Ages {
						b, ok := byKey[key{base, ph, k, load, a}]
						c, found := byKey[key{p, ph, k, load, a}]
						if !ok || !found || b.Mean == 0 || b.P99 == 0 {
							row = append(row, "-")
							continue
						}
						mark := ""
						if c.Mean-c.MeanCI > b.Mean+b.MeanCI {
							mark = "*"
						}
						row = append(row, fmt.Sprintf("%.2f/%.2f%s", c.Mean/b.Mean, c.P99/b.P99, mark))
					}
					fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
				}
			}
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
}
