package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/sim"
)

// Options tune a demo run.
type Options struct {
	// Duration ends the run and prints a summary; 0 runs until ctx ends.
	Duration time.Duration
	// Sites is how many of DefaultSites run (1 to 3).
	Sites int
	// Rate is requests per second; 0 means 70% of the grid's capacity.
	Rate float64
	// NoStory skips the scripted events.
	NoStory bool
	Out     io.Writer
	Log     *slog.Logger
}

// overload is the story's overload act's demand over what the grid has
// shown it can serve.
const overload = 1.6

// meanTokens is the mean output length the load generator asks for.
const meanTokens = 30

// meanDuration is what one request takes on an idle engine.
func meanDuration() time.Duration { return demoTTFT + (meanTokens-1)*demoTPOT }

// Run starts the grid, drives load through the first site's gateway, plays
// the story, and redraws the view every second until ctx ends or the
// duration passes; then it stops everything and prints a summary.
func Run(ctx context.Context, o Options) error {
	if o.Sites < 1 || o.Sites > len(DefaultSites) {
		return fmt.Errorf("--sites must be between 1 and %d", len(DefaultSites))
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	specs := DefaultSites[:o.Sites]
	capacity := 0
	for _, s := range specs {
		capacity += s.Endpoints * s.Slots
	}
	rate := o.Rate
	if rate <= 0 {
		rate = 0.7 * float64(capacity) / meanDuration().Seconds()
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.Duration > 0 {
		runCtx, cancel = context.WithTimeout(runCtx, o.Duration)
		defer cancel()
	}
	grid, err := Start(runCtx, specs, o.Log)
	if err != nil {
		return err
	}
	entry := grid.Sites[0]
	sites := "sites"
	if len(specs) == 1 {
		sites = "site"
	}
	var opening strings.Builder
	fmt.Fprintf(&opening, "grid demo: %d %s, %d slots, %.0f req/s of streaming chat into %s's gateway at %s\n",
		len(specs), sites, capacity, rate, entry.Spec.Name, entry.ClientURL)
	for _, s := range grid.Sites {
		fmt.Fprintf(&opening, "  %-8s %-7s %2d×%d slots  gateway %s  metrics %s/metrics  operator %s/metrics\n",
			s.Spec.Name, s.Spec.Kind, s.Spec.Endpoints, s.Spec.Slots, s.ClientURL, s.MetricsURL, s.OperatorMetricsURL)
	}
	fmt.Fprintf(&opening, "dashboard: %s/ui\n\n", entry.MetricsURL)
	io.WriteString(o.Out, opening.String())

	st := newStats()
	lg := &loadGen{url: entry.ClientURL + "/v1/chat/completions", stats: st, rate: atomicFloat(rate)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); lg.run(runCtx) }()
	events := make(chan string, 16)
	if !o.NoStory {
		wg.Add(1)
		go func() { defer wg.Done(); story(runCtx, grid, lg, rate, events) }()
	}
	interactive := isTerminal(o.Out)
	start := time.Now()
	t := time.NewTicker(time.Second)
	var log []string
	for done := false; !done; {
		select {
		case <-runCtx.Done():
			done = true
		case e := <-events:
			log = append(log, fmt.Sprintf("%4.0fs  %s", time.Since(start).Seconds(), e))
			if len(log) > 4 {
				log = log[len(log)-4:]
			}
		case <-t.C:
			draw(o.Out, interactive, opening.String(), grid, st.interval(), time.Since(start), lg.rate.load(), log)
		}
	}
	t.Stop()
	wg.Wait()
	grid.Wait()
	summary(o.Out, grid, st, time.Since(start))
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// atomicFloat is a float64 rate the story changes while the generator runs.
type atomicFloat64 struct{ bits atomic.Uint64 }

func atomicFloat(v float64) *atomicFloat64 {
	a := &atomicFloat64{}
	a.store(v)
	return a
}
func (a *atomicFloat64) load() float64   { return math.Float64frombits(a.bits.Load()) }
func (a *atomicFloat64) store(v float64) { a.bits.Store(math.Float64bits(v)) }

// loadGen sends Poisson arrivals of streaming chat completions.
type loadGen struct {
	url   string
	stats *stats
	rate  *atomicFloat64
}

// maxInFlight bounds the generator's own concurrency, so an overloaded grid
// cannot make it grow without bound.
const maxInFlight = 2000

func (lg *loadGen) run(ctx context.Context) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	next := time.Now()
	for {
		next = next.Add(time.Duration(rng.ExpFloat64() / lg.rate.load() * float64(time.Second)))
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		select {
		case sem <- struct{}{}:
		default:
			lg.stats.record("", 0, "dropped")
			continue
		}
		tokens := meanTokens/2 + rng.IntN(meanTokens+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			lg.one(ctx, client, tokens)
		}()
	}
}

// one sends one streaming request and records its site, time to first
// token and outcome.
func (lg *loadGen) one(ctx context.Context, client *http.Client, tokens int) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"tell me about the grid"}],"max_tokens":%d,"stream":true}`, sim.DefaultModel, tokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, lg.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			lg.stats.record("", 0, "error")
		}
		return
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusTooManyRequests:
		lg.stats.record("", 0, "429")
		return
	case http.StatusServiceUnavailable:
		lg.stats.record("", 0, "503")
		return
	default:
		lg.stats.record("", 0, "error")
		return
	}
	site := resp.Header.Get("X-Grid-Site")
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		if ctx.Err() == nil {
			lg.stats.record(site, 0, "error")
		}
		return
	}
	ttft := time.Since(start)
	io.Copy(io.Discard, r)
	lg.stats.record(site, ttft, "ok")
}

// stats accumulates outcomes per interval and in total.
type stats struct {
	mu       sync.Mutex
	cur, all window
}

type window struct {
	picks    map[string]int
	ttft     map[string][]time.Duration
	outcomes map[string]int
}

func newWindow() window {
	return window{picks: map[string]int{}, ttft: map[string][]time.Duration{}, outcomes: map[string]int{}}
}

func newStats() *stats { return &stats{cur: newWindow(), all: newWindow()} }

func (s *stats) record(site string, ttft time.Duration, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range []*window{&s.cur, &s.all} {
		w.outcomes[outcome]++
		if outcome == "ok" {
			w.picks[site]++
			w.ttft[site] = append(w.ttft[site], ttft)
		}
	}
}

// interval returns the window since the last call and starts a new one.
func (s *stats) interval() window {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.cur
	s.cur = newWindow()
	return w
}

func quantile(d []time.Duration, q float64) string {
	if len(d) == 0 {
		return "-"
	}
	slices.Sort(d)
	v := d[int(math.Ceil(q*float64(len(d))))-1]
	if v >= time.Second {
		return fmt.Sprintf("%.1fs", v.Seconds())
	}
	return fmt.Sprintf("%dms", v.Milliseconds())
}

// draw renders the live view under the opening block (the addresses stay
// on screen); it fits 80 columns. What the engines hold (RUN, WAIT, BUSY)
// and what the entry gateway believes (CEILING, RHO) are separate
// columns, and the legend says which is which.
func draw(out io.Writer, interactive bool, opening string, g *Grid, w window, elapsed time.Duration, rate float64, log []string) {
	var b strings.Builder
	if interactive {
		b.WriteString("\033[H\033[2J")
	}
	b.WriteString(opening)
	entry := g.Sites[0]
	fmt.Fprintf(&b, "t=%3.0fs  load %3.0f req/s into %s  (Ctrl-C stops)\n\n", elapsed.Seconds(), rate, entry.Spec.Name)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SITE\tSLOTS\tSTATE\tRUN\tWAIT\tBUSY\tCEILING\tRHO\tPICKS\tTTFT p50\tp99\t")
	snap := entry.Gateway.Snapshot()
	total := 0
	for _, n := range w.picks {
		total += n
	}
	var slots, running, waiting int
	for _, s := range g.Sites {
		c := candidate(snap, s.Spec.Name)
		state, ceiling, rho := "unknown", "-", "-"
		if c != nil {
			state = "ready"
			if c.Admission != route.NewAndExisting {
				state = "EXCLUDED"
			} else if math.IsNaN(c.Score) {
				state = "DEMOTED"
			}
			if c.Measured {
				ceiling, rho = fmt.Sprintf("%.0f", c.Ceiling), fmt.Sprintf("%.2f", c.Rho)
			}
		}
		if snap.Shedding[sim.DefaultModel] {
			state += "/shed"
		}
		run, wait := 0, 0
		for _, e := range s.Sim.Engines() {
			l := e.Load()
			run, wait = run+l.Running, wait+l.Waiting
		}
		slots, running, waiting = slots+s.Slots(), running+run, waiting+wait
		share := "-"
		if total > 0 {
			share = fmt.Sprintf("%3.0f%%", 100*float64(w.picks[s.Spec.Name])/float64(total))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Spec.Name, s.Slots(), state, run, wait,
			busy(run, s.Slots()), ceiling, rho, share, quantile(w.ttft[s.Spec.Name], 0.5), quantile(w.ttft[s.Spec.Name], 0.99))
	}
	all := allTTFT(w)
	fmt.Fprintf(tw, "all\t%d\t\t%d\t%d\t%s\t\t\t\t%s\t%s\t\n", slots, running, waiting, busy(running, slots),
		quantile(all, 0.5), quantile(all, 0.99))
	tw.Flush()
	fmt.Fprintf(&b, "At the engines now: RUN running, WAIT queued, BUSY = RUN / SLOTS.\n")
	fmt.Fprintf(&b, "What %s's gateway believes: CEILING, the most it has seen a site run at\n", entry.Spec.Name)
	fmt.Fprintf(&b, "once; RHO, its smoothed load over that ceiling (near 1 before BUSY is).\n")
	fmt.Fprintf(&b, "Last second through %s: PICKS, each site's share; TTFT, time to first token.\n", entry.Spec.Name)
	fmt.Fprintf(&b, "\nlast second: %d served, their TTFT p50 %s p99 %s\n", w.outcomes["ok"], quantile(all, 0.5), quantile(all, 0.99))
	fmt.Fprintf(&b, "             %d shed (429), %d unavailable (503), %d errors\n",
		w.outcomes["429"], w.outcomes["503"], w.outcomes["error"]+w.outcomes["dropped"])
	for _, l := range log {
		fmt.Fprintln(&b, "  "+l)
	}
	if !interactive {
		b.WriteString("\n")
	}
	io.WriteString(out, b.String())
}

// busy is running over slots as a whole percentage.
func busy(running, slots int) string {
	if slots == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(running)/float64(slots))
}

// allTTFT is every site's time to first token of a window, together.
func allTTFT(w window) []time.Duration {
	var all []time.Duration
	for _, d := range w.ttft {
		all = append(all, d...)
	}
	return all
}

func candidate(s *route.Snapshot, site string) *route.Candidate {
	for i := range s.Candidates {
		if s.Candidates[i].Site == site {
			return &s.Candidates[i]
		}
	}
	return nil
}

func summary(out io.Writer, g *Grid, st *stats, elapsed time.Duration) {
	st.mu.Lock()
	w := st.all
	st.mu.Unlock()
	fmt.Fprintf(out, "\nsummary after %.0fs\n", elapsed.Seconds())
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SITE\tSLOTS\tSERVED\tSHARE\tTTFT p50\tp99\t")
	total := 0
	for _, n := range w.picks {
		total += n
	}
	names := make([]string, 0, len(g.Sites))
	for _, s := range g.Sites {
		names = append(names, s.Spec.Name)
	}
	sort.Strings(names)
	for _, s := range g.Sites {
		share := "-"
		if total > 0 {
			share = fmt.Sprintf("%.0f%%", 100*float64(w.picks[s.Spec.Name])/float64(total))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t\n", s.Spec.Name, s.Slots(), w.picks[s.Spec.Name], share,
			quantile(w.ttft[s.Spec.Name], 0.5), quantile(w.ttft[s.Spec.Name], 0.99))
	}
	tw.Flush()
	fmt.Fprintf(out, "requests: %d served, %d shed (429), %d unavailable (503), %d errors\n",
		w.outcomes["ok"], w.outcomes["429"], w.outcomes["503"], w.outcomes["error"]+w.outcomes["dropped"])
}

// learnedCapacity is the sum of the ceilings the entry gateway learned.
func learnedCapacity(g *Grid) float64 {
	total := 0.0
	seen := map[string]bool{}
	for _, c := range g.Sites[0].Gateway.Snapshot().Candidates {
		if c.Measured && !seen[c.Site] {
			seen[c.Site] = true
			total += c.Ceiling
		}
	}
	return total
}

// story plays the scripted events, announcing each as it happens.
func story(ctx context.Context, g *Grid, lg *loadGen, rate float64, events chan<- string) {
	say := func(s string) {
		g.Sites[0].Gateway.Note(s) // on the dashboard too
		select {
		case events <- s:
		default:
		}
	}
	at := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	control := func(s *Site, body string) {
		resp, err := http.Post(s.SimURL+"/sim/control", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}
	// The acts fit the README's --duration 60s: a burst at 8 s, an outage
	// at 23 s, an overload from 38 s to 55 s.
	big := g.Sites[len(g.Sites)-1]
	if !at(8 * time.Second) {
		return
	}
	if len(g.Sites) > 1 {
		say(fmt.Sprintf("burst: another client fills %s (the biggest site) directly for 10s", big.Spec.Name))
		burst, stop := context.WithTimeout(ctx, 10*time.Second)
		var wg sync.WaitGroup
		for range big.Slots() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for burst.Err() == nil {
					req, _ := http.NewRequestWithContext(burst, http.MethodPost, big.SimURL+"/v1/chat/completions",
						strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"burst","max_tokens":100}`, sim.DefaultModel)))
					if resp, err := http.DefaultClient.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}()
		}
		wg.Wait()
		stop()
		say(fmt.Sprintf("burst over: %s drains", big.Spec.Name))
		if !at(5 * time.Second) {
			return
		}
	}
	small := g.Sites[0]
	say(fmt.Sprintf("%s's EPP reports no ready endpoint: its site is excluded", small.Spec.Name))
	control(small, `{"readyEndpoints": 0}`)
	if !at(10 * time.Second) {
		return
	}
	control(small, `{"readyEndpoints": null}`)
	say(fmt.Sprintf("%s is ready again and rejoins", small.Spec.Name))
	if !at(5 * time.Second) {
		return
	}
	// Overload on what the grid has shown it can hold, not on its nominal
	// slots: a loaded machine serves slower than the model assumes, and
	// the act must overload the grid as it is. 1.6× that is an overload
	// every site feels; the gateways shed (full_after_ms 2 s, in
	// grid.go) before the queues grow long, so the admitted requests'
	// time to first token recovers while the excess is refused.
	over := overload * max(rate, learnedCapacity(g)/meanDuration().Seconds())
	say(fmt.Sprintf("demand rises to %.0f req/s, %.1f× what the grid has served: watch it shed", over, overload))
	lg.rate.store(over)
	if !at(15 * time.Second) {
		return
	}
	lg.rate.store(rate)
	say("demand back to 70%: shedding stops once sites have room")
}
