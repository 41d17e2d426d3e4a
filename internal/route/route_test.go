package route

import (
	"fmt"
	"math"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/signals"
)

// world is a load store, a builder and candidate sites, driven in timeline
// milliseconds.
type world struct {
	t     *testing.T
	store *loadstore.Store
	b     *Builder
	set   Settings
	// ageAware builds with the age-aware policy, reading ages in meanMs
	// and siteMs (the world is its Pace); ignoreOwn reads the board alone,
	// shareOnly always draws by share (AgeAwareOptions.ShareOnly).
	// The policy is made at the first such build and kept.
	ageAware, ignoreOwn, uncertain, shareOnly bool
	meanMs                                    float64
	siteMs                                    map[string]float64
	// served is the world's observed service of remote sites, by site
	// (Pace.Served); absent, a site's claims are read as they are.
	served map[string]*Served
	aa     *AgeAware
	// obs, when set, makes the policy the latency policy, reading what
	// obs observed of the sites (and ages as ageAware does).
	obs   *Service
	lat   *Latency
	cands []Candidate
	seq   int64
}

func newWorld(t *testing.T, sites ...string) *world {
	w := &world{t: t, store: loadstore.New(time.Hour), b: NewBuilder(Reference{}), set: DefaultSettings}
	w.set.WindowMs = 500
	for _, s := range sites {
		w.cands = append(w.cands, Candidate{Model: "m", Site: s, Provider: "p", Upstream: &url.URL{Scheme: "http", Host: s}})
	}
	return w
}

// obs is what a site publishes at one instant.
type obs struct {
	running float64
	ready   float64 // 0 means 1 unless zeroReady
	zero    bool    // publish ready = 0
	queue   *float64
	held    []float64
	perPod  *float64
	kv      *float64
	uid     string // the provider's uid; "u" when empty
	// provider names the provider (and its pool); "p" when empty.
	provider string
	// maxRunning is the unit's relayed limit (signals.MaxRunning).
	maxRunning *float64
}

func f(v float64) *float64 { return &v }

// publish ingests one batch of site at t: running, ready, and the rest,
// with a complete batch metadata line so the site is learnable.
func (w *world) publish(site string, t int64, o obs) {
	w.t.Helper()
	ready := 1.0
	if o.ready > 0 {
		ready = o.ready
	}
	if o.zero {
		ready = 0
	}
	provider := o.provider
	if provider == "" {
		provider = "p"
	}
	lbl := fmt.Sprintf(`grid_provider=%q,grid_site=%q`, provider, site)
	lines := []string{
		fmt.Sprintf(`llm_d_epp_average_running_requests{%s,name=%q} %g %d`, lbl, provider, o.running, t),
		fmt.Sprintf(`llm_d_epp_ready_endpoints{%s,name=%q} %g %d`, lbl, provider, ready, t),
	}
	if o.queue != nil {
		lines = append(lines, fmt.Sprintf(`llm_d_epp_average_queue_size{%s,name=%q} %g %d`, lbl, provider, *o.queue, t))
	}
	for i, h := range o.held {
		lines = append(lines, fmt.Sprintf(`llm_d_epp_flow_control_queue_size{%s,priority="%d"} %g %d`, lbl, i, h, t))
	}
	if o.perPod != nil {
		lines = append(lines, fmt.Sprintf(`inference_pool_per_pod_queue_size{%s,model_server_pod="a",name=%q} %g %d`, lbl, provider, *o.perPod, t))
	}
	if o.kv != nil {
		lines = append(lines, fmt.Sprintf(`llm_d_epp_average_kv_cache_utilization{%s,name=%q} %g %d`, lbl, provider, *o.kv, t))
	}
	if o.maxRunning != nil {
		lines = append(lines, fmt.Sprintf(`%s{%s} %g %d`, signals.MaxRunning, lbl, *o.maxRunning, t))
	}
	w.seq++
	uid := o.uid
	if uid == "" {
		uid = "u"
	}
	lines = append(lines, fmt.Sprintf(`grid_provider_config_generation{batch_samples="%d",batch_sequence="%d",%s,provider_uid=%q,publisher_epoch="1"} 1 %d`, len(lines), w.seq, lbl, uid, t))
	res := w.store.Ingest([]byte(strings.Join(lines, "\n")+"\n"), t, t, t, signals.Origin{Site: "hub", Relay: true})
	if res.Refused.Total() != 0 {
		w.t.Fatalf("ingest refused %v", res.Refused)
	}
}

func (w *world) build(now int64) *Snapshot { return w.buildDown(now, nil) }

// buildDown builds with the world's policy, down demoting candidates.
func (w *world) buildDown(now int64, down func(*Candidate) bool) *Snapshot {
	w.b.SetPolicy(w.policy())
	return w.b.Build(w.store, w.cands, now, down, w.set)
}

func (w *world) policy() Policy {
	if w.obs != nil {
		if w.lat == nil {
			w.lat = NewLatency(w, w.obs)
		}
		return w.lat
	}
	if !w.ageAware {
		return Reference{}
	}
	if w.aa == nil {
		w.aa = NewAgeAware(w, AgeAwareOptions{IgnoreOwnSends: w.ignoreOwn, Uncertain: w.uncertain, ShareOnly: w.shareOnly})
	}
	return w.aa
}

// MeanMs and SiteMs make the world the age-aware policy's Pace.
func (w *world) MeanMs() float64 { return w.meanMs }
func (w *world) SiteMs(site string) (float64, bool) {
	ms, ok := w.siteMs[site]
	return ms, ok
}
func (w *world) Served(site, _ string) *Served { return w.served[site] }

func find(s *Snapshot, site string) *Candidate {
	for i := range s.Candidates {
		if s.Candidates[i].Site == site {
			return &s.Candidates[i]
		}
	}
	return nil
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-3 }

// about is the examples' "≈": within a tenth.
func about(a, b float64) bool { return math.Abs(a-b) < 0.1 }

// The worked examples of docs/protocol.md §4.11. Examples 1 and 3 decay the
// reference's single ceiling; under the two bounds the soft bound does not
// decay (1b, 3b).
func TestWorkedExamples(t *testing.T) {
	t.Run("1 first sample, decay, no new sample", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.SingleCeiling = true
		w.publish("a", 1000, obs{running: 40, queue: f(0)})
		a := find(w.build(1000), "a")
		if a.Ceiling != 40 || a.Rho != 1 {
			t.Fatalf("first: ceiling %v rho %v", a.Ceiling, a.Rho)
		}
		w.publish("a", 2000, obs{running: 10, queue: f(0)})
		a = find(w.build(2000), "a")
		if !near(a.Ceiling, 39.954) || !near(a.Rho, 0.7751) {
			t.Fatalf("second: ceiling %v rho %v", a.Ceiling, a.Rho)
		}
		rho := a.Rho
		if a = find(w.build(2500), "a"); a.Rho != rho {
			t.Errorf("no new sample changed rho: %v -> %v", rho, a.Rho)
		}
	})
	t.Run("2 quiet site floored", func(t *testing.T) {
		w := newWorld(t, "a")
		w.publish("a", 1000, obs{running: 1, queue: f(0)})
		if a := find(w.build(1000), "a"); a.Ceiling != 8 || a.Rho != 1.0/8 {
			t.Fatalf("ceiling %v rho %v", a.Ceiling, a.Rho)
		}
	})
	t.Run("1b the soft bound keeps what was shown", func(t *testing.T) {
		w := newWorld(t, "a")
		w.publish("a", 1000, obs{running: 40, queue: f(0)})
		w.build(1000)
		w.publish("a", 2000, obs{running: 10, queue: f(0)})
		if a := find(w.build(2000), "a"); a.Ceiling != 40 || !near(a.Rho, 0.775) {
			t.Fatalf("ceiling %v rho %v", a.Ceiling, a.Rho)
		}
	})
	t.Run("3 half-life", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.SingleCeiling = true
		w.publish("a", 1000, obs{running: 80, queue: f(0)})
		w.build(1000)
		w.publish("a", 601_000, obs{running: 10, queue: f(0)})
		if a := find(w.build(601_000), "a"); !near(a.Ceiling, 40) {
			t.Fatalf("ceiling %v", a.Ceiling)
		}
	})
	t.Run("3b a shrink is learned from a backlog", func(t *testing.T) {
		w := newWorld(t, "a")
		w.publish("a", 1000, obs{running: 80, queue: f(0)})
		w.build(1000)
		w.publish("a", 601_000, obs{running: 10, queue: f(0)})
		if a := find(w.build(601_000), "a"); a.Ceiling != 80 {
			t.Fatalf("idle for a half-life: ceiling %v, want 80", a.Ceiling)
		}
		w.publish("a", 602_000, obs{running: 40, queue: f(5)})
		if a := find(w.build(602_000), "a"); a.Ceiling != 40 || a.RawRho != 1 {
			t.Fatalf("a backlog at 40 running: ceiling %v raw rho %v, want 40 and 1", a.Ceiling, a.RawRho)
		}
		// The limit grows back by the half-life, and no further than the
		// 80 it once ran.
		w.publish("a", 1_202_000, obs{running: 10, queue: f(0)})
		if a := find(w.build(1_202_000), "a"); a.Ceiling != 80 {
			t.Fatalf("a half-life on: ceiling %v, want 80 (grown back to what it showed)", a.Ceiling)
		}
		w.publish("a", 2_402_000, obs{running: 10, queue: f(0)})
		if a := find(w.build(2_402_000), "a"); a.Ceiling != 80 {
			t.Fatalf("three half-lives on: ceiling %v, want 80", a.Ceiling)
		}
	})
	t.Run("4 explore floor", func(t *testing.T) {
		w := newWorld(t, "a", "b")
		w.publish("a", 1000, obs{running: 120, queue: f(0)})
		w.publish("b", 1000, obs{running: 2, queue: f(0)})
		s := w.build(1000)
		if a, b := find(s, "a"), find(s, "b"); a.Capacity != 120 || b.Capacity != 30 {
			t.Fatalf("capacities %v %v", a.Capacity, b.Capacity)
		}
	})
	// Examples 5-7 keep the running count at the learned 40 and put the
	// rest of the reference's in-flight in the queue: the queued part of an
	// in-flight count teaches nothing, the running part teaches the soft
	// bound (docs/protocol.md §4.11; 5b).
	t.Run("5 queued sample teaches nothing", func(t *testing.T) {
		w := newWorld(t, "a")
		w.publish("a", 1000, obs{running: 40, queue: f(0)})
		w.build(1000)
		w.publish("a", 2000, obs{running: 40, queue: f(360)})
		if a := find(w.build(2000), "a"); !about(a.Ceiling, 40) || a.Rho != 1 {
			t.Fatalf("ceiling %v rho %v", a.Ceiling, a.Rho)
		}
	})
	t.Run("5 under the single ceiling", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.SingleCeiling = true
		w.publish("a", 1000, obs{running: 40, queue: f(0)})
		w.build(1000)
		w.publish("a", 2000, obs{running: 400, queue: f(5)})
		if a := find(w.build(2000), "a"); !about(a.Ceiling, 40) || a.Rho != 1 {
			t.Fatalf("ceiling %v rho %v", a.Ceiling, a.Rho)
		}
	})
	t.Run("5b running at a backlog teaches", func(t *testing.T) {
		w := newWorld(t, "a")
		w.publish("a", 1000, obs{running: 40, queue: f(0)})
		w.build(1000)
		w.publish("a", 2000, obs{running: 400, queue: f(5)})
		if a := find(w.build(2000), "a"); a.Ceiling != 400 || a.Rho != 1 {
			t.Fatalf("ceiling %v rho %v", a.Ceiling, a.Rho)
		}
	})
	t.Run("6 one busy pod", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.Shedding, w.set.FullAfterMs = true, 0
		w.publish("a", 1000, obs{running: 40, queue: f(0)})
		w.build(1000)
		w.publish("a", 2000, obs{running: 40, queue: f(0.25), perPod: f(1)})
		s := w.build(2000)
		if a := find(s, "a"); !about(a.Ceiling, 40) || a.Full != No || s.Shedding["m"] {
			t.Fatalf("ceiling %v full %v shed %v", a.Ceiling, a.Full, s.Shedding)
		}
	})
	t.Run("7 held work", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.Shedding, w.set.FullAfterMs = true, 0
		w.publish("a", 1000, obs{running: 40, queue: f(0)})
		w.build(1000)
		w.publish("a", 2000, obs{running: 40, queue: f(0), held: []float64{60}})
		s := w.build(2000)
		if a := find(s, "a"); !about(a.Ceiling, 40) || a.Rho != 1 || !s.Shedding["m"] {
			t.Fatalf("ceiling %v rho %v shed %v", a.Ceiling, a.Rho, s.Shedding)
		}
	})
	t.Run("8 transient zero", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.WindowMs = 30_000
		for i, v := range []float64{120, 0, 108} {
			w.publish("a", int64(i+1)*1000, obs{running: v, queue: f(0)})
		}
		if a := find(w.build(3000), "a"); a.Ceiling != 120 || a.Rho != 1 {
			t.Fatalf("ceiling %v rho %v", a.Ceiling, a.Rho)
		}
	})
	t.Run("9 genuine drain", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.WindowMs = 30_000
		for i, v := range []float64{120, 108, 0} {
			w.publish("a", int64(i+1)*1000, obs{running: v, queue: f(0)})
		}
		// Only the last sample is inside the window at 32.5s.
		if a := find(w.build(32_500), "a"); a.Ceiling != 8 || a.Rho != 0 {
			t.Fatalf("ceiling %v rho %v", a.Ceiling, a.Rho)
		}
	})
	t.Run("10 in-flight join", func(t *testing.T) {
		w := newWorld(t, "a")
		w.set.WindowMs = 30_000
		w.publish("a", 1000, obs{running: 10, ready: 2, queue: f(0)})
		w.publish("a", 2000, obs{running: 20, ready: 1, queue: f(0)})
		w.publish("a", 3000, obs{running: 4, zero: true, queue: f(0)})
		v, _ := w.store.View(loadstore.Key{Site: "a", Provider: "p"})
		r := Read(&v, 3000, 30_000, 1)
		if r.InFlight != some(20) || !r.Unready {
			t.Fatalf("reading %+v", r)
		}
		if a := find(w.build(3000), "a"); a.Admission != Excluded || !math.IsNaN(a.Score) {
			t.Errorf("unready site admitted: %+v", a)
		}
	})
	t.Run("10b operator verdict", func(t *testing.T) {
		// An operator that cannot scrape a provider publishes its verdict
		// without load rows; the 0 excludes until a newer batch says 1.
		w := newWorld(t, "a")
		w.publish("a", 1000, obs{running: 4, queue: f(0)})
		verdict := func(t0 int64, v int) {
			w.seq++
			w.store.Ingest([]byte(fmt.Sprintf("grid_provider_ready{grid_provider=\"p\",grid_site=\"a\"} %d %d\n"+
				"grid_provider_config_generation{batch_samples=\"1\",batch_sequence=\"%d\",grid_provider=\"p\",grid_site=\"a\",provider_uid=\"u\",publisher_epoch=\"1\"} 1 %d\n",
				v, t0, w.seq, t0)), t0, t0, t0, signals.Origin{Site: "hub", Relay: true})
		}
		verdict(2000, 0)
		if a := find(w.build(2000), "a"); a.Admission != Excluded {
			t.Fatalf("a provider the operator judged unready is admitted: %+v", a)
		}
		// Silence keeps it excluded.
		if a := find(w.build(60_000), "a"); a.Admission != Excluded {
			t.Fatalf("silence readmitted it: %+v", a)
		}
		verdict(61_000, 1)
		if a := find(w.build(61_000), "a"); a.Admission != NewAndExisting {
			t.Errorf("a verdict of 1 did not readmit it: %+v", a)
		}
	})
	t.Run("11 held summed across partitions", func(t *testing.T) {
		w := newWorld(t, "a")
		w.publish("a", 1000, obs{running: 10, queue: f(0), held: []float64{0, 4, 3}})
		v, _ := w.store.View(loadstore.Key{Site: "a", Provider: "p"})
		if r := Read(&v, 1000, 500, 1); r.Held != some(7) || r.InFlight != some(17) {
			t.Fatalf("reading %+v", r)
		}
	})
}

// TestShedLatch is worked example 12, under the reference code's single
// ceiling. TestShedLatchBounds shows where the soft/hard bounds differ.
func TestShedLatch(t *testing.T) {
	w := newWorld(t, "a", "b")
	w.set.SingleCeiling = true
	w.set.Smoothing, w.set.Shedding, w.set.FullAfterMs, w.set.RoomAfterMs = 1, true, 0, 0
	now := int64(1000)
	step := func(a, aq, b, bq float64) bool {
		now += 1000
		w.publish("a", now, obs{running: a, queue: f(aq)})
		w.publish("b", now, obs{running: b, queue: f(bq)})
		return w.build(now).Shedding["m"]
	}
	// Learn ceilings of 100 on both.
	step(100, 0, 100, 0)
	for _, tc := range []struct {
		name         string
		a, aq, b, bq float64
		shed         bool
	}{
		{"both at capacity with a queue", 95, 5, 97, 3, true},
		{"b flat out but not queued", 95, 5, 100, 0, false},
		{"shed again", 95, 5, 97, 3, true},
		{"b at 97+3 stays shed", 95, 5, 97, 3, true},
		{"b at 90+3 releases", 95, 5, 87, 3, false},
	} {
		if got := step(tc.a, tc.aq, tc.b, tc.bq); got != tc.shed {
			t.Errorf("%s: shed %v", tc.name, got)
		}
	}
}

// TestShedLatchHoldsUntilRelieved: once shedding, a model keeps shedding
// while no site is relieved, even where no site is full: after a pause in
// readings longer than the load window, a congested site's spell starts
// over (not full for full_after_ms), but it still has no room. Shedding
// stops once a site is relieved (docs/protocol.md §4.11 step 7).
func TestShedLatchHoldsUntilRelieved(t *testing.T) {
	w := newWorld(t, "a", "b")
	w.set.SingleCeiling = true
	w.set.Smoothing, w.set.Shedding, w.set.FullAfterMs, w.set.RoomAfterMs = 1, true, 2000, 0
	w.set.WindowMs = 5000 // a congested spell carries across rebuilds within one window
	now := int64(1000)
	step := func(after int64, a, aq, b, bq float64) *Snapshot {
		now += after
		w.publish("a", now, obs{running: a, queue: f(aq)})
		w.publish("b", now, obs{running: b, queue: f(bq)})
		return w.build(now)
	}
	step(1000, 100, 0, 100, 0) // ceilings of 100
	for _, tc := range []struct {
		name         string
		after        int64
		a, aq, b, bq float64
		shed         bool
	}{
		{"both congested", 1000, 95, 5, 97, 3, false},
		{"congested 1 s", 1000, 95, 5, 97, 3, false},
		{"congested 2 s: full", 1000, 95, 5, 97, 3, true},
		{"readings resume after 6 s, still congested: not full, not relieved", 6000, 95, 5, 97, 3, true},
		{"b's backlog clears: relieved", 1000, 95, 5, 80, 0, false},
	} {
		s := step(tc.after, tc.a, tc.aq, tc.b, tc.bq)
		if got := s.Shedding["m"]; got != tc.shed {
			t.Errorf("%s: shed %v, want %v (b full %v, relieved %v)", tc.name, got, tc.shed, find(s, "b").Full, find(s, "b").Relieved)
		}
	}
}

// TestShedLatchBounds: with the hard bound, a queue that forms with fewer
// running is a newly demonstrated limit: the site is full there.
func TestShedLatchBounds(t *testing.T) {
	w := newWorld(t, "a", "b")
	w.set.Smoothing, w.set.Shedding, w.set.FullAfterMs, w.set.RoomAfterMs = 1, true, 0, 0
	now := int64(1000)
	step := func(a, aq, b, bq float64) *Snapshot {
		now += 1000
		w.publish("a", now, obs{running: a, queue: f(aq)})
		w.publish("b", now, obs{running: b, queue: f(bq)})
		return w.build(now)
	}
	step(100, 0, 100, 0)
	if !step(95, 5, 97, 3).Shedding["m"] {
		t.Fatal("not shed at capacity")
	}
	s := step(95, 5, 87, 3)
	if !s.Shedding["m"] || find(s, "b").Ceiling != 87 {
		t.Errorf("b queued 3 with 87 running: shed %v, ceiling %v; want shed at a hard bound of 87", s.Shedding["m"], find(s, "b").Ceiling)
	}
	// The queue empties: relieved, released; held 95 with nothing queued
	// exceeds the hard bound, which is forgotten.
	s = step(95, 5, 95, 0)
	if s.Shedding["m"] || find(s, "b").Ceiling < 99 {
		t.Errorf("b relieved: shed %v, ceiling %v", s.Shedding["m"], find(s, "b").Ceiling)
	}
}

func TestKVTermRaisesRho(t *testing.T) {
	w := newWorld(t, "a")
	w.publish("a", 1000, obs{running: 4, queue: f(0), kv: f(0.9)})
	if a := find(w.build(1000), "a"); a.Rho != 0.9 {
		t.Errorf("rho %v, want the KV term 0.9 over the count's 0.5", a.Rho)
	}
	w.set.SingleCeiling = true
	w2 := newWorld(t, "a")
	w2.set.SingleCeiling = true
	w2.publish("a", 1000, obs{running: 4, queue: f(0), kv: f(0.9)})
	if a := find(w2.build(1000), "a"); a.Rho != 0.5 {
		t.Errorf("single ceiling rho %v, want 0.5", a.Rho)
	}
}

func TestShedDebounce(t *testing.T) {
	w := newWorld(t, "a")
	w.set.Shedding, w.set.Smoothing = true, 1
	w.set.WindowMs = 30_000
	w.publish("a", 500, obs{running: 100, queue: f(0)})
	w.build(500) // learn 100
	shedAt := func(ms int64, running, queue float64) bool {
		w.publish("a", ms, obs{running: running, queue: f(queue)})
		return w.build(ms).Shedding["m"]
	}
	for _, tc := range []struct {
		at             int64
		running, queue float64
		shed           bool
	}{
		{2000, 100, 5, false},
		{6000, 100, 5, false},
		{7500, 100, 5, true},
		{8100, 45, 5, true}, // a dip is not room
		{10500, 45, 0, false},
	} {
		if got := shedAt(tc.at, tc.running, tc.queue); got != tc.shed {
			t.Errorf("at %dms: shed %v, want %v", tc.at, got, tc.shed)
		}
	}
}

// TestSelectionProperties are the §4.12 properties and example 14.
func TestSelectionProperties(t *testing.T) {
	t.Run("rho-1 site never picked; heaviest of three never by two choices", func(t *testing.T) {
		w := newWorld(t, "a", "b", "c", "d")
		w.set.Smoothing, w.set.CeilingFloor = 1, 1
		for _, s := range []string{"a", "b", "c", "d"} {
			w.publish(s, 1000, obs{running: 10, queue: f(0)})
		}
		w.build(1000)
		for s, v := range map[string]float64{"a": 2, "b": 8, "c": 5, "d": 10} {
			w.publish(s, 2000, obs{running: v, queue: f(0)})
		}
		snap := w.build(2000)
		counts := map[string]int{}
		for turn := range uint64(4000) {
			p := snap.Pick("m", turn, snap.BuiltAt)
			if p.Path != PathTwoChoices {
				t.Fatalf("path %v", p.Path)
			}
			counts[p.Candidate.Site]++
		}
		if counts["d"] != 0 || counts["b"] != 0 || counts["a"] <= counts["c"] {
			t.Errorf("picks %v", counts)
		}
	})
	t.Run("two sites keep at least 10% for the slower", func(t *testing.T) {
		w := newWorld(t, "a", "b")
		w.set.Smoothing, w.set.CeilingFloor = 1, 1
		w.teachThenRead(map[string]float64{"a": 100, "b": 10}, map[string]float64{"a": 0, "b": 9})
		snap := w.build(2000)
		b := 0
		for turn := range uint64(4000) {
			if snap.Pick("m", turn, snap.BuiltAt).Candidate.Site == "b" {
				b++
			}
		}
		// rate(a) = 100, rate(b) = 25/1.9: b gets about 11.6%.
		if b < 280 || b > 520 {
			t.Errorf("b got %d of 4000", b)
		}
	})
	t.Run("no room: by capacity", func(t *testing.T) {
		w := newWorld(t, "a", "b")
		w.set.Smoothing, w.set.CeilingFloor = 1, 1
		w.publish("a", 1000, obs{running: 30})
		w.publish("b", 1000, obs{running: 10})
		snap := w.build(1000)
		a := 0
		for turn := range uint64(4000) {
			p := snap.Pick("m", turn, snap.BuiltAt)
			if p.Path != PathByCapacity {
				t.Fatalf("path %v", p.Path)
			}
			if p.Candidate.Site == "a" {
				a++
			}
		}
		if a < 2700 || a > 3300 {
			t.Errorf("a got %d of 4000, want about 75%%", a)
		}
	})
	t.Run("tied candidates split evenly", func(t *testing.T) {
		w := newWorld(t, "a", "b", "c")
		for _, s := range []string{"a", "b", "c"} {
			w.publish(s, 1000, obs{running: 4, queue: f(0)})
		}
		snap := w.build(1000)
		counts := map[string]int{}
		for turn := range uint64(3000) {
			counts[snap.Pick("m", turn, snap.BuiltAt).Candidate.Site]++
		}
		for s, n := range counts {
			if n < 850 || n > 1150 {
				t.Errorf("%s got %d of 3000", s, n)
			}
		}
	})
	t.Run("demoted and excluded sites never drawn", func(t *testing.T) {
		w := newWorld(t, "a", "b", "c")
		w.publish("a", 1000, obs{running: 1, queue: f(0)})
		w.publish("b", 1000, obs{running: 1, zero: true, queue: f(0)})
		w.publish("c", 1000, obs{running: 1, queue: f(0)})
		snap := w.buildDown(1000, func(c *Candidate) bool { return c.Site == "c" })
		for turn := range uint64(1000) {
			if s := snap.Pick("m", turn, snap.BuiltAt).Candidate.Site; s != "a" {
				t.Fatalf("picked %s", s)
			}
		}
	})
}

func TestRefusals(t *testing.T) {
	w := newWorld(t, "a")
	if p := w.build(0).Pick("m", 0, 0); p.Outcome != Routed {
		t.Errorf("cold start with no signals: %+v", p) // unmeasured, by capacity
	}
	if p := (&Snapshot{}).Pick("m", 0, 0); p.Outcome != NoRoute {
		t.Errorf("empty snapshot: %v", p.Outcome)
	}
	if p := w.build(0).Pick("other", 0, 0); p.Outcome != UnknownModel {
		t.Errorf("unknown model: %v", p.Outcome)
	}
	w.publish("a", 1000, obs{running: 1, zero: true})
	if p := w.build(1000).Pick("m", 0, 1000); p.Outcome != NotReady {
		t.Errorf("every candidate excluded: %v", p.Outcome)
	}
	w.cands[0].Upstream = nil
	w.publish("a", 2000, obs{running: 1})
	if p := w.build(2000).Pick("m", 0, 2000); p.Outcome != NoRoute {
		t.Errorf("admitted but unroutable: %v", p.Outcome)
	}
}

func TestPickAllocatesNothing(t *testing.T) {
	for _, ageAware := range []bool{false, true} {
		w := newWorld(t, "a", "b", "c", "d")
		w.ageAware, w.set.WindowMs = ageAware, 5000
		for i, s := range []string{"a", "b", "c", "d"} {
			w.publish(s, 1000, obs{running: float64(i), queue: f(0)})
		}
		snap := w.build(2000)
		turn := uint64(0)
		var path Path
		if n := testing.AllocsPerRun(1000, func() { turn++; path = snap.Pick("m", turn, snap.BuiltAt).Path }); n != 0 {
			t.Errorf("age-aware %v: Pick allocates %v times", ageAware, n)
		}
		if ageAware && path != PathAgeAware {
			t.Errorf("age-aware pick took path %v", path)
		}
	}
}

// TestRenewedIdentityLearnsFromItsOwnSamples: a provider that comes back
// as another identity (a new uid: the engine was replaced) learns its
// capacity from what it reports, not from the old engine's in-flight counts
// still in the load window.
func TestRenewedIdentityLearnsFromItsOwnSamples(t *testing.T) {
	w := newWorld(t, "a")
	w.set.WindowMs, w.set.CeilingFloor = 60_000, 1
	w.publish("a", 1000, obs{running: 40, queue: f(0)})
	if c := find(w.build(1000), "a"); c.Capacity != 40 {
		t.Fatalf("the control: learned %v, want 40", c.Capacity)
	}
	w.publish("a", 2000, obs{running: 4, queue: f(0)})
	if c := find(w.build(2000), "a"); c.Capacity != 40 {
		t.Fatalf("the same identity keeps what it showed: %v, want 40", c.Capacity)
	}
	w.publish("a", 3000, obs{running: 4, queue: f(0), uid: "v"})
	if c := find(w.build(3000), "a"); c.Capacity != 4 {
		t.Errorf("a replaced engine learned %v from the old one's samples, want 4", c.Capacity)
	}
}

// TestSmallerThanTheFloorLearnsItsLimit: a 4-slot engine under a
// ceiling_floor of 8 is read at the floor until a backlog shows its limit,
// then at that limit, not at the floor (it drew 36 % of traffic on a 25 %
// capacity share when the floor held). The limit does not grow back to
// the floor with time: it was credited 8 again once a half-life, sent a
// backlog, and taught its limit anew (4/4/4/64 at load 0.5, T = 20:
// 1.026–1.055 against weighted round robin's 1.005–1.009). Holding more
// than the limit with nothing waiting still forgets it.
func TestSmallerThanTheFloorLearnsItsLimit(t *testing.T) {
	w := newWorld(t, "a")
	w.set.WindowMs, w.set.CeilingFloor, w.set.RoomAfterMs, w.set.CeilingHalfLifeMs = 60_000, 8, 0, 60_000
	w.publish("a", 1000, obs{running: 2, queue: f(0)})
	if c := find(w.build(1000), "a"); c.Capacity != 8 {
		t.Fatalf("nothing shown yet: capacity %v, want the floor 8", c.Capacity)
	}
	w.publish("a", 2000, obs{running: 4, queue: f(1)}) // a backlog at 4 + 1
	if c := find(w.build(2000), "a"); c.Capacity > 5 {
		t.Errorf("after a backlog at 5 in flight: capacity %v, want at most 5", c.Capacity)
	}
	w.publish("a", 182_000, obs{running: 4, queue: f(0)}) // three half-lives on, at its limit
	if c := find(w.build(182_000), "a"); c.Capacity != 4 {
		t.Errorf("three half-lives on, running 4: capacity %v, want the 4 it showed, not the floor", c.Capacity)
	}
	w.publish("a", 183_000, obs{running: 5, queue: f(0)}) // it runs more now
	if c := find(w.build(183_000), "a"); c.Capacity != 8 {
		t.Errorf("running 5 with nothing waiting: capacity %v, want the floor 8 again", c.Capacity)
	}
}

// TestDeclaredLimitBoundsTheFloor: a unit whose operator relays the most
// it runs at once (signals.MaxRunning) is credited no more than that
// before it shows its limit, so an engine of 4 is not sent the floor's 8;
// a claim above the floor lifts nothing, and what a unit was seen to run
// stands over what it declares.
func TestDeclaredLimitBoundsTheFloor(t *testing.T) {
	w := newWorld(t, "small", "claims", "ranmore", "pool")
	w.set.WindowMs, w.set.CeilingFloor, w.set.RoomAfterMs = 60_000, 8, 0
	w.publish("small", 1000, obs{running: 2, queue: f(0), maxRunning: f(4)})
	w.publish("claims", 1000, obs{running: 2, queue: f(0), maxRunning: f(64)})
	w.publish("ranmore", 1000, obs{running: 6, queue: f(0), maxRunning: f(4)})
	w.publish("pool", 1000, obs{running: 1, ready: 2, queue: f(0), maxRunning: f(3)})
	s := w.build(1000)
	for site, want := range map[string]float64{"small": 4, "claims": 8, "ranmore": 6, "pool": 6} {
		if c := find(s, site); c.Capacity != want {
			t.Errorf("%s: capacity %v, want %v", site, c.Capacity, want)
		}
	}
	// A limit relayed after the first readings lowers the floor as one
	// relayed from the start does; what was seen stands over it.
	late := newWorld(t, "late")
	late.set.WindowMs, late.set.CeilingFloor, late.set.RoomAfterMs = 60_000, 8, 0
	late.publish("late", 1000, obs{running: 2, queue: f(0)})
	if c := find(late.build(1000), "late"); c.Capacity != 8 {
		t.Fatalf("no limit relayed yet: capacity %v, want the floor 8", c.Capacity)
	}
	late.publish("late", 2000, obs{running: 2, queue: f(0), maxRunning: f(3)})
	if c := find(late.build(2000), "late"); c.Capacity != 3 {
		t.Errorf("a limit of 3 relayed late: capacity %v, want 3", c.Capacity)
	}
}

// TestBusySiteKeepsItsCapacity: a site read with a queue at almost every
// reading keeps the capacity its running count shows. The soft bound learned
// only from readings with nothing waiting decayed between the rare clean
// ones: in internal/routesim at load 0.9 with readings ten mean durations
// apart, a 32-slot site read 24-29 and a 16-slot one 9-15, and the default
// herded (docs/routing.md).
func TestBusySiteKeepsItsCapacity(t *testing.T) {
	w := newWorld(t, "a")
	w.set.WindowMs, w.set.CeilingHalfLifeMs = 11_000, 60_000
	w.publish("a", 1000, obs{running: 32, queue: f(0)})
	w.build(1000)
	for at := int64(11_000); at <= 600_000; at += 10_000 {
		w.publish("a", at, obs{running: 32, queue: f(3)})
		if c := find(w.build(at), "a"); c.Ceiling != 32 {
			t.Fatalf("at %d ms, after %d s of readings with a queue: ceiling %v, want 32", at, (at-1000)/1000, c.Ceiling)
		}
	}
}

// TestRestrictKeepsThePolicy: a view narrowed to some candidates (the hop
// view) draws with the age-aware policy, counts its sends in the same
// counters, and sheds as the snapshot it came from.
func TestRestrictKeepsThePolicy(t *testing.T) {
	w := newWorld(t, "a", "b", "c")
	w.ageAware, w.set.WindowMs, w.set.SingleCeiling = true, 5000, true
	w.set.Smoothing, w.set.Shedding, w.set.FullAfterMs, w.set.RoomAfterMs = 1, true, 0, 0
	for i, s := range []string{"a", "b", "c"} {
		w.publish(s, 1000, obs{running: float64(10 * (i + 1)), queue: f(0)})
	}
	whole := w.build(2000)
	view := whole.Restrict(func(c *Candidate) bool { return c.Site != "a" })
	if len(view.Candidates) != 2 || view.Candidates[0].Site != "b" || view.Candidates[1].Site != "c" {
		t.Fatalf("the view's candidates: %+v", view.Candidates)
	}
	if p := view.Pick("m", 1, view.BuiltAt); p.Path != PathAgeAware {
		t.Errorf("the view picked by path %v, want the age-aware draw", p.Path)
	}
	// The view's sends are the gateway's own: the whole snapshot sees them.
	if got := ownInFlight(whole, 2000); got < 0.99 {
		t.Errorf("a send through the view: %v own sends in the whole snapshot, want 1", got)
	}
	// Every site at its capacity with a queue: the snapshot sheds, and so
	// does a view of it.
	for _, s := range []string{"a", "b", "c"} {
		w.publish(s, 3000, obs{running: 30, queue: f(5)})
	}
	full := w.build(4000)
	if !full.Shedding["m"] {
		t.Fatal("the control: the full snapshot does not shed")
	}
	if p := full.Restrict(func(c *Candidate) bool { return c.Site == "b" }).Pick("m", 1, 4000); p.Outcome != Shed {
		t.Errorf("a view of a shedding snapshot: %v, want shed", p.Outcome)
	}
}

// teachThenRead has each site of taught hold that many requests with
// nothing queued at 1000 ms (teaching its capacity), builds, and has each
// site of read report that many in flight at 2000 ms.
func (w *world) teachThenRead(taught, read map[string]float64) {
	w.t.Helper()
	for site, n := range taught {
		w.publish(site, 1000, obs{running: n, queue: f(0)})
	}
	w.build(1000)
	for site, n := range read {
		w.publish(site, 2000, obs{running: n, queue: f(0)})
	}
}

// busyAndIdle is an age-aware world of two sites that learned a capacity of
// 40 at 1000 ms and read, at 2000 ms, a at 36 in flight and b at 4; meanMs
// is the mean request duration.
func busyAndIdle(t *testing.T, meanMs float64) *world {
	w := newWorld(t, "a", "b")
	w.ageAware, w.meanMs, w.set.WindowMs = true, meanMs, 60_000
	w.teachThenRead(map[string]float64{"a": 40, "b": 40}, map[string]float64{"a": 36, "b": 4})
	return w
}

// TestAgeAwareReadsAge: a fresh reading is taken at its word (the least
// loaded site is the only active one); an old one says little, so every site
// becomes active and draws follow capacity.
func TestAgeAwareReadsAge(t *testing.T) {
	w := busyAndIdle(t, 1000)
	fresh := w.build(2000)
	if a, b := find(fresh, "a"), find(fresh, "b"); a.Active || !b.Active {
		t.Errorf("fresh: a active %v, b active %v; want only b", a.Active, b.Active)
	}
	old := w.build(2000 + 20_000) // twenty mean durations later
	if a, b := find(old, "a"), find(old, "b"); !a.Active || !b.Active {
		t.Errorf("old: a active %v, b active %v; want both", a.Active, b.Active)
	}
}

// TestNoAnswerYetLeansOnCapacity: a gateway that has seen no answer end
// (just started, or restarted into a loaded grid) reads ages in the prior
// unit, DefaultServiceMs, which errs short: a board two seconds old says
// little, and both sites are drawn by capacity. A prior of 10 s read it as
// a fifth of a unit old, drew only the site that read idle, and on real
// processes a rolling restart of three replicas a site herded onto it
// (BENCHMARKS.md).
func TestNoAnswerYetLeansOnCapacity(t *testing.T) {
	w := busyAndIdle(t, 0) // no unit learned: the policy takes the prior
	snap := w.build(2000 + 2000)
	if a, b := find(snap, "a"), find(snap, "b"); !a.Active || !b.Active {
		t.Errorf("a board 2 s old, no answer seen: a active %v, b active %v; want both", a.Active, b.Active)
	}
}

// TestAgeAwareReadsAgeAtThePick: a snapshot lives a poll interval, which
// for short requests is many request durations; its picks read each
// reading's age at their own instant. Right after the build only the idle
// site is drawn; twenty mean durations later, from the same snapshot, both
// are, by capacity.
func TestAgeAwareReadsAgeAtThePick(t *testing.T) {
	w := busyAndIdle(t, 100)
	snap := w.build(2000)
	// Twenty picks at one instant, own sends counted as on the request path.
	share := func(at int64) float64 {
		n := 0
		for turn := range uint64(20) {
			if snap.Pick("m", uint64(at)+turn, at).Candidate.Site == "a" {
				n++
			}
		}
		return float64(n) / 20
	}
	if got := share(2000); got != 0 {
		t.Errorf("at the build: a drawn %.2f of picks, want none (b is idle)", got)
	}
	if got := share(2000 + 20*100); got < 0.25 || got > 0.75 {
		t.Errorf("twenty mean durations on: a drawn %.2f of picks, want about half (the board says nothing any more)", got)
	}
}

// TestAgeAwareHoldsAPersistingBacklog: the age unit is this gateway's
// request duration (100 ms here); a site busy with far longer requests sent
// to it directly keeps a backlog that the unit would predict drained within
// a few hundred ms. Seen once, the backlog drains in the model (a quarter
// of the picks half a second on). Site a holds five times its two slots,
// which it would turn over in five units (500 ms) at the unit's pace: a
// backlog seen to persist no longer than that is no evidence (a full site
// shows one while its requests turn over) and drains as if seen once;
// seen to persist a second, it is held for the 500 ms its requests cannot
// explain, so the picks half a second after the reading all go to the
// idle site. Holding the whole second read every queue of a grid at load
// 0.98 as stuck (internal/routesim, 10 sites × 16, 64 gateways).
func TestAgeAwareHoldsAPersistingBacklog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		since int64 // the instant a's backlog was first read, 0: none before the latest
		held  bool
	}{{"seen once", 0, false}, {"persisting as it turns over", 2600, false}, {"seen to persist", 2000, true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "a", "b")
			w.ageAware, w.meanMs, w.set.WindowMs, w.set.CeilingFloor = true, 100, 60_000, 1
			w.publish("a", 1000, obs{running: 2, queue: f(0)}) // teach a 2 slots, b 8
			w.publish("b", 1000, obs{running: 8, queue: f(0)})
			w.build(1000)
			if tc.since > 0 {
				w.publish("a", tc.since, obs{running: 2, queue: f(8)})
				w.publish("b", tc.since, obs{running: 0, queue: f(0)})
			}
			w.publish("a", 3000, obs{running: 2, queue: f(8)})
			w.publish("b", 3000, obs{running: 0, queue: f(0)})
			snap := w.build(3000)
			at := int64(3500)
			n := 0
			for turn := range uint64(40) {
				if boardOnly(snap).Pick("m", turn, at).Candidate.Site == "a" {
					n++
				}
			}
			if tc.held && n != 0 {
				t.Errorf("a drawn %d of 40 picks half a second after a backlog read to persist a second, want none", n)
			}
			if !tc.held && n == 0 {
				t.Errorf("a drawn none of 40 picks five mean durations after the latest reading (backlog first read at %d ms); the model drains it", tc.since)
			}
		})
	}
}

// TestSlowSiteDrawsItsRate: two idle sites of 8 slots, one whose requests
// this gateway has seen take four times longer: the draws follow the rate
// at which each completes requests, about one in five to the slow site,
// and its reading is read in its own unit.
func TestSlowSiteDrawsItsRate(t *testing.T) {
	w := newWorld(t, "a", "b")
	w.ageAware, w.meanMs, w.set.WindowMs = true, 100, 60_000
	w.siteMs = map[string]float64{"a": 400, "b": 100}
	w.teachThenRead(map[string]float64{"a": 8, "b": 8}, map[string]float64{"a": 0, "b": 0})
	snap := w.build(2000)
	toA := 0
	for turn := range uint64(1000) {
		if boardOnly(snap).Pick("m", turn, 2000).Candidate.Site == "a" {
			toA++
		}
	}
	if share := float64(toA) / 1000; share < 0.15 || share > 0.25 {
		t.Errorf("the 4× slower site drew %.3f of requests, want about 0.2", share)
	}
	if a, b := unitOf(snap, "a"), unitOf(snap, "b"); a != 400 || b != 100 {
		t.Errorf("units %v and %v, want each site's own", a, b)
	}
}

// TestReplicasSharingABoardSpread: gateway replicas that read one board make
// one prediction; each sees only its own sends. One mean duration after the
// readings (a at 90% of its capacity, b at 10%), the water model gives a
// about a third of the flow. Eight replicas taking four requests each send a
// its share; "the least loaded of two" sent every replica's requests to b
// until each one's own sends alone had filled it.
func TestReplicasSharingABoardSpread(t *testing.T) {
	w := newWorld(t, "a", "b")
	w.ageAware, w.meanMs, w.set.WindowMs = true, 1000, 60_000
	w.publish("a", 1000, obs{running: 40, queue: f(0)}) // teach both 40
	w.publish("b", 1000, obs{running: 40, queue: f(0)})
	w.build(1000)
	w.publish("a", 2000, obs{running: 36, queue: f(0)})
	w.publish("b", 2000, obs{running: 4, queue: f(0)})
	// Each replica's snapshot of the one board, read by a policy of its own.
	replicas := make([]*Snapshot, 8)
	for k := range replicas {
		w.aa = nil
		replicas[k] = w.build(2000)
	}
	toA := 0
	for turn := range 4 {
		for k, snap := range replicas {
			if snap.Pick("m", uint64(1000*k+turn), 3000).Candidate.Site == "a" {
				toA++
			}
		}
	}
	if toA < 6 || toA > 16 {
		t.Errorf("a took %d of 32 requests, want about a third", toA)
	}
}

// TestOwnCountDecidesWhenInformed: a gateway holding enough of the
// grid's requests routes by its own count of them, which is exact and
// current, scaled to the grid by what the readings counted, plus what a
// reading showed beyond that. In the harness (internal/routesim) it took
// sites 8/16/32 at load 0.9, four gateways, from the draw by share's
// 1.09-1.14 mean durations to 1.07 (the oracle's 1.05).
// heldWorld is an age-aware world of two sites, a and b, that learned a
// capacity of 32 each: this gateway sent heldA and heldB requests that
// have not ended, then readings of readA and readB arrived (beyond 32,
// queued). It returns the snapshot built on those readings; configure,
// when not nil, sets the world's policy up before the first build.
func heldWorld(t *testing.T, configure func(*world), readA, readB float64, heldA, heldB int) (*Snapshot, *world) {
	w := newWorld(t, "a", "b")
	w.ageAware, w.meanMs = true, 1000
	if configure != nil {
		configure(w)
	}
	w.served = map[string]*Served{"a": {}, "b": {}}
	w.publish("a", 1000, obs{running: 32, queue: f(0)}) // teach both 32
	w.publish("b", 1000, obs{running: 32, queue: f(0)})
	w.build(1000)
	for range heldA {
		w.served["a"].Begin(1500)
	}
	for range heldB {
		w.served["b"].Begin(1500)
	}
	w.publish("a", 2000, obs{running: min(readA, 32), queue: f(max(readA-32, 0))})
	w.publish("b", 2000, obs{running: min(readB, 32), queue: f(max(readB-32, 0))})
	return w.build(2000), w
}

func TestOwnCountDecidesWhenInformed(t *testing.T) {
	shareOnly := false
	world := func(readA, readB float64, heldA, heldB int) *Snapshot {
		snap, _ := heldWorld(t, func(w *world) { w.shareOnly = shareOnly }, readA, readB, heldA, heldB)
		return snap
	}
	toA := func(snap *Snapshot) int {
		n := 0
		for turn := range uint64(40) {
			if snap.Pick("m", turn, 2100).Candidate.Site == "a" {
				n++
			}
		}
		return n
	}
	// The board reads both sites alike; this gateway holds ten requests
	// at a and none at b: the others' are alike, so b holds fewer.
	informed := world(8, 8, 10, 0)
	if n := toA(informed); n != 0 {
		t.Errorf("holding 10 at a and none at b, a took %d of 40", n)
	}
	if p := informed.Pick("m", 1, 2100); p.Path != PathOwnCount {
		t.Errorf("the own count decided, path %q", p.Path)
	}
	// Holding five at each, a's reading shows fifteen more than the
	// gateways' part (3.5 times this one's): a client sends to it
	// directly. Counted alone, the two would tie.
	if n := toA(world(25, 10, 5, 5)); n != 0 {
		t.Errorf("with a load from outside the gateways at a, a took %d of 40", n)
	}
	// Holding four, fewer than ownInformed, the draw by share decides:
	// both sites, alike on the board, are drawn.
	if n := toA(world(8, 8, 4, 0)); n == 0 || n == 40 {
		t.Errorf("holding four requests, a took %d of 40: want the draw by share", n)
	}
	// With ShareOnly, the policy before the own count, ten held decide
	// nothing either.
	shareOnly = true
	if n := toA(world(8, 8, 10, 0)); n == 0 || n == 40 {
		t.Errorf("drawing by share only, holding 10 at a, a took %d of 40", n)
	}
}

func BenchmarkPick(b *testing.B) {
	for _, policy := range []string{PolicyReference, PolicyAgeAware, PolicyLatency} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("policy=%s/sites=%d", policy, n), func(b *testing.B) {
				w := newWorld(&testing.T{})
				w.ageAware, w.meanMs, w.set.WindowMs = policy != PolicyReference, 2000, 5000
				if policy == PolicyLatency {
					// The first site is this one's; the others are a round
					// trip away, and every request has a size the model knows.
					w.obs = &Service{}
					for i := range 64 {
						w.obs.Costs().Observe(Cost{Prompt: 200 + 50*i, MaxOutput: 100 + i}, 30+0.05*float64(200+50*i), 5*float64(100+i), true)
					}
				}
				for i := range n {
					site := fmt.Sprintf("s%02d", i)
					w.cands = append(w.cands, Candidate{Model: "m", Site: site, Provider: "p", Upstream: &url.URL{Host: site}, Local: policy == PolicyLatency && i == 0})
					w.publish(site, 1000, obs{running: float64(i % 7), queue: f(0)})
					if w.obs != nil && i > 0 {
						w.obs.RoundTrip(site).Observe(float64(20 + i))
					}
					if w.ageAware { // every site read in its own settled unit
						if w.siteMs == nil {
							w.siteMs = map[string]float64{}
						}
						w.siteMs[site] = float64(1000 + 250*(i%5))
					}
				}
				snap := w.build(1000)
				b.ReportAllocs()
				turn := uint64(0)
				cost := Cost{Prompt: 800, MaxOutput: 200}
				for b.Loop() {
					turn++
					snap.PickSized("m", cost, turn, 1000+int64(turn%1000)) // time moves, as on the request path
				}
			})
		}
	}
}

// TestIdleSplitFollowsLearnedCapacity: once capacities are learned, idle
// sites share new requests in proportion to them.
func TestIdleSplitFollowsLearnedCapacity(t *testing.T) {
	w := newWorld(t, "a", "b")
	w.set.WindowMs = 500
	w.publish("a", 1000, obs{running: 40, queue: f(0)})
	w.publish("b", 1000, obs{running: 120, queue: f(0)})
	w.build(1000)
	w.publish("a", 2000, obs{running: 0, queue: f(0)})
	w.publish("b", 2000, obs{running: 0, queue: f(0)})
	w.set.Smoothing = 1
	snap := w.build(2000)
	b := 0
	for turn := range uint64(4000) {
		if snap.Pick("m", turn, snap.BuiltAt).Candidate.Site == "b" {
			b++
		}
	}
	// rates 40 and 120: b takes three quarters.
	if b < 2800 || b > 3200 {
		t.Errorf("b got %d of 4000, want about 3000", b)
	}
}

// TestAgeAwareOwnSendsDecay: this gateway's own sends count while they are
// likely in flight, whatever the age of the reading they add to. Idle sites
// whose readings differ in age share sequential requests evenly (an older
// reading does not make old sends weigh less than new ones), and a burst
// sent at one instant spreads evenly too.
func TestAgeAwareOwnSendsDecay(t *testing.T) {
	w := newWorld(t, "a", "b")
	w.ageAware, w.meanMs, w.set.WindowMs = true, 100, 60_000
	w.publish("a", 1000, obs{running: 8, queue: f(0)}) // teach both 8
	w.publish("b", 1000, obs{running: 8, queue: f(0)})
	w.build(1000)
	w.publish("b", 2000, obs{running: 0, queue: f(0)}) // b's reading: 1 s old at 3000
	w.publish("a", 2990, obs{running: 0, queue: f(0)}) // a's: fresh
	snap := w.build(3000)
	counts := map[string]int{}
	for k := range int64(400) { // one request every two mean durations
		counts[snap.Pick("m", uint64(k), 3000+200*k).Candidate.Site]++
	}
	if counts["a"] < 140 || counts["b"] < 140 {
		t.Errorf("sequential requests on idle sites: %v, want an even split", counts)
	}
	w.publish("a", 90_000, obs{running: 0, queue: f(0)})
	w.publish("b", 90_000, obs{running: 0, queue: f(0)})
	snap = w.build(90_500)
	burst := map[string]int{}
	for k := range uint64(16) {
		burst[snap.Pick("m", 1000+k, 90_500).Candidate.Site]++
	}
	if burst["a"] < 6 || burst["b"] < 6 {
		t.Errorf("a burst of 16 on idle sites: %v, want about 8 each", burst)
	}
}

// TestOwnSendsDrainWithTheBacklog: sends to a site with a queue wait behind
// it, so they do not complete while the queue stands; sends to a site with
// free slots complete exponentially.
func TestOwnSendsDrainWithTheBacklog(t *testing.T) {
	const mean, capacity = 1000.0, 8.0
	if got := decayed(4, 1000, mean, 2, capacity); !near(got, 4) {
		t.Errorf("4 sends behind a queue of one capacity, one mean duration later: %v in flight, want 4", got)
	}
	if got, want := decayed(4, 1000, mean, 0.2, capacity), 4*math.Exp(-1); !near(got, want) {
		t.Errorf("4 sends to a site with free slots, one mean duration later: %v, want %v", got, want)
	}
	if got := decayed(4, 0, mean, 0.2, capacity); got != 4 {
		t.Errorf("no time elapsed: %v", got)
	}
}

// TestForgetStartsLearningAfresh: once the store forgets a provider, the
// builder drops its learned bounds too, so a provider that returns under
// the same name is learned from its new readings alone.
func TestForgetStartsLearningAfresh(t *testing.T) {
	w := newWorld(t, "a")
	w.set.CeilingFloor = 1
	w.publish("a", 1000, obs{running: 40, queue: f(0)})
	if c := find(w.build(1000), "a"); c.Ceiling != 40 {
		t.Fatalf("learned ceiling %v, want 40", c.Ceiling)
	}
	w.b.Forget(w.store.Forget(2000))
	w.publish("a", 3000, obs{running: 5, queue: f(0)})
	if c := find(w.build(3000), "a"); c.Ceiling != 5 {
		t.Errorf("ceiling after forgetting %v, want 5 (learned afresh)", c.Ceiling)
	}
}

// TestPickNeverWritesTheSnapshot: the snapshot is immutable once built; the
// age-aware pick's own sends go to its picker's counters, which a rebuild
// keeps while the readings stay the same, and a policy that ignores own
// sends counts none.
func TestPickNeverWritesTheSnapshot(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		w := newWorld(t, "a", "b")
		w.ageAware, w.ignoreOwn, w.meanMs, w.set.WindowMs = true, ignore, 100, 60_000
		w.teachThenRead(map[string]float64{"a": 8, "b": 8}, map[string]float64{"a": 0, "b": 0})
		snap := w.build(2000)
		before := append([]Candidate(nil), snap.Candidates...)
		burst := map[string]int{}
		for k := range uint64(16) {
			burst[snap.Pick("m", k, 2000).Candidate.Site]++
		}
		if !reflect.DeepEqual(before, snap.Candidates) {
			t.Error("picks changed the snapshot")
		}
		counted := ownInFlight(snap, 2000)
		if ignore {
			if counted != 0 {
				t.Errorf("own sends ignored: %v counted after 16 picks", counted)
			}
			continue
		}
		if burst["a"] < 6 || burst["b"] < 6 {
			t.Errorf("a burst of 16 with own sends: %v, want about 8 each", burst)
		}
		if counted < 15.9 {
			t.Errorf("own sends %v after 16 picks, want 16", counted)
		}
		// A rebuild keeps the counters of readings that did not change: the
		// sends just made still weigh on the next snapshot.
		if total := ownInFlight(w.build(2001), 2001); total < 14 {
			t.Errorf("own sends after a rebuild: %.1f in flight, want about 16", total)
		}
	}
}

// ownInFlight is what the age-aware picker of snap counts of this
// gateway's sends at now, over every candidate.
func ownInFlight(snap *Snapshot, now int64) (total float64) {
	pk := snap.picker.(*ageAwarePicker)
	for i := range pk.cands {
		if c := pk.cands[i].own; c != nil {
			total += c.inFlight(now, pk.cands[i].unitMs, snap.Candidates[i].Predicted, snap.Candidates[i].Ceiling)
		}
	}
	return total
}

// boardOnly is snap read by the board alone: its age-aware picker without
// own-send counters, so repeated picks at one instant read the same loads.
func boardOnly(snap *Snapshot) *Snapshot {
	r := *snap
	bare := func(pk *ageAwarePicker) *ageAwarePicker {
		b := &ageAwarePicker{cands: append([]ageCandidate(nil), pk.cands...), uncertain: pk.uncertain}
		for i := range b.cands {
			b.cands[i].own = nil
		}
		return b
	}
	switch pk := snap.picker.(type) {
	case *ageAwarePicker:
		r.picker = bare(pk)
	case *latencyPicker:
		lp := *pk
		lp.ageAwarePicker = bare(pk.ageAwarePicker)
		r.picker = &lp
	}
	return &r
}

// unitOf is the age unit snap's age-aware picker reads site in.
func unitOf(snap *Snapshot, site string) float64 {
	for i := range snap.Candidates {
		if snap.Candidates[i].Site == site {
			return snap.picker.(*ageAwarePicker).cands[i].unitMs
		}
	}
	return 0
}

// TestClaimedProvidersShareOneFloor: capacity a provider has not
// demonstrated is credited per site and model: a site's idle providers
// weigh one floor together, however many it claims. Under the default
// policy a site that claims 64 idle providers draws about what it draws
// claiming one, instead of 64 floors' worth (which took 99 of 100 requests
// from a victim with one demonstrated provider). The reference policy's
// arms compare providers, not sites, so there many claimed providers still
// win every two-choices draw against a busier site (docs/security.md); its
// figures are logged, not held.
func TestClaimedProvidersShareOneFloor(t *testing.T) {
	share := func(ageAware bool, claimed int) float64 {
		w := newWorld(t, "home")
		w.ageAware, w.meanMs = ageAware, 1000
		publish := func(site, provider string, at int64, running float64) {
			w.publish(site, at, obs{running: running, queue: f(0), provider: provider})
		}
		for i := range claimed {
			p := fmt.Sprintf("h%02d", i)
			w.cands = append(w.cands, Candidate{Model: "m", Site: "hostile", Provider: p, Upstream: &url.URL{Scheme: "http", Host: p}})
		}
		// home demonstrated 16 (held with nothing queued), then idles;
		// the hostile site's providers claim to be idle.
		publish("home", "p", 1000, 16)
		w.build(1000)
		publish("home", "p", 2000, 0)
		for i := range claimed {
			publish("hostile", fmt.Sprintf("h%02d", i), 2000, 0)
		}
		snap := w.build(2000)
		var weight float64
		for _, c := range snap.Candidates {
			if c.Site == "hostile" {
				weight += c.Capacity
			}
		}
		if weight > w.set.CeilingFloor+1e-9 {
			t.Errorf("%d idle hostile providers weigh %.2f together, more than one floor (%g)", claimed, weight, w.set.CeilingFloor)
		}
		hostile := 0
		for turn := range uint64(2000) {
			if p := snap.Pick("m", turn, 2000+int64(turn)*10); p.Candidate != nil && p.Candidate.Site == "hostile" {
				hostile++
			}
		}
		return float64(hostile) / 2000
	}
	for _, ageAware := range []bool{false, true} {
		one, many := share(ageAware, 1), share(ageAware, 64)
		t.Logf("age-aware %v: the hostile site draws %.2f claiming one provider, %.2f claiming 64", ageAware, one, many)
		if ageAware && (many > one+0.03 || many > 0.5) {
			t.Errorf("age-aware %v: claiming 64 idle providers draws %.2f, claiming one %.2f", ageAware, many, one)
		}
	}
}

// hostileWorld is home (16 demonstrated), west (an honest remote site, 16
// demonstrated) and hostile, a remote site listed first that claims
// claimed idle providers, all read at 2000 ms.
func hostileWorld(t *testing.T, ageAware bool, claimed int) (*world, *Snapshot) {
	return hostileWorldDrawn(t, ageAware, false, claimed)
}

// hostileWorldDrawn is hostileWorld, drawing by share alone when shareOnly
// (AgeAwareOptions.ShareOnly).
func hostileWorldDrawn(t *testing.T, ageAware, shareOnly bool, claimed int) (*world, *Snapshot) {
	w := newWorld(t)
	w.ageAware, w.shareOnly, w.meanMs = ageAware, shareOnly, 1000
	w.served = map[string]*Served{"west": {}, "hostile": {}}
	publish := func(site, provider string, at int64, running float64) {
		w.publish(site, at, obs{running: running, queue: f(0), provider: provider})
	}
	for i := range claimed {
		p := fmt.Sprintf("h%02d", i)
		w.cands = append(w.cands, Candidate{Model: "m", Site: "hostile", Provider: p, Upstream: &url.URL{Scheme: "http", Host: p}})
	}
	w.cands = append(w.cands,
		Candidate{Model: "m", Site: "home", Provider: "p", Local: true, Upstream: &url.URL{Scheme: "http", Host: "home"}},
		Candidate{Model: "m", Site: "west", Provider: "p", Upstream: &url.URL{Scheme: "http", Host: "west"}})
	for _, site := range []string{"home", "west"} {
		publish(site, "p", 1000, 16)
	}
	w.build(1000)
	for _, site := range []string{"home", "west"} {
		publish(site, "p", 2000, 0)
	}
	for i := range claimed {
		publish("hostile", fmt.Sprintf("h%02d", i), 2000, 0)
	}
	return w, w.build(2000)
}

// shares draws n picks from snap at 1 ms apart from 2000 and returns each
// site's share.
func shares(snap *Snapshot, n int) map[string]float64 {
	out := map[string]float64{}
	for turn := range uint64(n) {
		if p := snap.Pick("m", turn, 2000+int64(turn)); p.Candidate != nil {
			out[p.Candidate.Site] += 1 / float64(n)
		}
	}
	return out
}

// TestClaimedProvidersCrowdNoSiteOut: a pick weighs at most MaxSites
// candidates, and a site claiming 64 idle providers, listed first, once
// filled every place: an honest idle site drew nothing (0 of 583 on real
// processes). Each site now keeps its first providers in turn, and under
// the default policy the honest site draws at least half its share of the
// capacity (16 of 40) whatever the hostile site claims.
func TestClaimedProvidersCrowdNoSiteOut(t *testing.T) {
	for _, ageAware := range []bool{false, true} {
		for _, claimed := range []int{1, 64} {
			_, snap := hostileWorld(t, ageAware, claimed)
			got := shares(snap, 2000)
			t.Logf("age-aware %v, %d claimed: %v", ageAware, claimed, got)
			if got["west"] == 0 {
				t.Errorf("age-aware %v, %d claimed: west drew nothing", ageAware, claimed)
			}
			if ageAware && got["west"] < 0.5*16/40 {
				t.Errorf("%d claimed: west drew %.2f, under half its capacity share (%.2f)", claimed, got["west"], 16.0/40)
			}
		}
	}
}

// TestASiteIsOneBucket: the age-aware draw weighs sites, not providers. A
// burst of 40 requests at one instant, with home and west half full (8 of
// 16) and the hostile site claiming 64 idle providers (8 slots together):
// read as one bucket, the hostile site fills to the others' level and then
// shares by capacity, about 11 of the 40; read as 64 buckets of an eighth
// of a slot, each provider took one request before it looked loaded, and
// the site took nearly the whole burst.
func TestASiteIsOneBucket(t *testing.T) {
	w, _ := hostileWorld(t, true, 64)
	for _, site := range []string{"home", "west"} {
		w.publish(site, 2000, obs{running: 8, queue: f(0)})
	}
	snap := w.build(2000)
	hostile := 0
	for turn := range uint64(40) {
		if p := snap.Pick("m", turn, 2000); p.Candidate != nil && p.Candidate.Site == "hostile" {
			hostile++
		}
	}
	if hostile > 16 {
		t.Errorf("the site claiming 64 idle providers took %d of a burst of 40", hostile)
	}
	t.Logf("the hostile site took %d of 40", hostile)
}

// TestContradictedClaimsAreReadByObservation: a remote site is read at
// what this gateway sees it serve. The hostile site claims 64 idle
// providers, with nothing queued, and does not serve: the requests the
// gateway sent it waited three units before their answers began, while
// its readings taken during the wait still said it was idle, and it holds
// twelve more. Its trust falls with the answers that contradicted it, the
// requests it holds count against what it is trusted with, and it stops
// being drawn while the honest sites have room. An honest site whose
// readings show the queue the requests waited in keeps its trust, and a
// site whose answers agree with its board again earns it back.
func TestContradictedClaimsAreReadByObservation(t *testing.T) {
	// Trusted still, a site holding more than its claimed ceiling (8) of
	// this gateway's requests is full, whatever its board says: the next
	// 24 requests, which the honest sites have room for, go there.
	fresh, _ := hostileWorld(t, true, 64)
	for range 12 {
		fresh.served["hostile"].Begin(1500)
	}
	if got := shares(fresh.build(2000), 24)["hostile"]; got > 0 {
		t.Errorf("a site holding 12 of this gateway's requests on a claimed 8 draws %.2f", got)
	}
	// The own count decided there, reading what the gateway holds by
	// itself; the draw by share, which decides while the gateway holds
	// fewer than ownInformed, reads the site as full too.
	byShare, _ := hostileWorldDrawn(t, true, true, 64)
	for range 12 {
		byShare.served["hostile"].Begin(1500)
	}
	if got := shares(byShare.build(2000), 24)["hostile"]; got > 0 {
		t.Errorf("drawn by share, a site holding 12 of this gateway's requests on a claimed 8 draws %.2f", got)
	}

	w, snap := hostileWorld(t, true, 64)
	before := shares(snap, 2000)["hostile"]
	sv := w.served["hostile"]
	for range 12 {
		sv.Begin(1500) // held, never answered
	}
	// Answered at 3500, having waited in the queue from 500 to 3400: the
	// reading at 2000 was taken during the wait.
	for range 40 {
		sv.Begin(1500)
		sv.Judge(3500, waitedFrom500)
		sv.End(3500)
	}
	if tr := sv.Trust(3500); tr > 0.2 {
		t.Fatalf("trust after 40 contradicted answers: %.2f", tr)
	}
	snap = w.build(2000)
	after := shares(snap, 2000)
	t.Logf("hostile share: %.2f before, %.2f after 40 contradicted answers, holding 12", before, after["hostile"])
	if after["hostile"] > 0.01 {
		t.Errorf("the site that holds 12 and was contradicted still draws %.2f", after["hostile"])
	}
	if after["west"] < 0.5*16/32 {
		t.Errorf("west drew %.2f", after["west"])
	}
	// An answer that waited after the reading was taken does not
	// contradict it: the queue it met may have formed since.
	honest := w.served["west"]
	honest.Begin(3100)
	honest.Judge(6000, Wait{FromMs: 3100, ToMs: 5900})
	honest.End(6000)
	if tr := honest.Trust(6000); tr != 1 {
		t.Errorf("a wait that began after the reading contradicted it: trust %.2f", tr)
	}
	// Answers that agree with the board earn the trust back.
	for range 12 {
		sv.End(3500)
	}
	for range 100 {
		sv.Begin(1500)
		sv.Judge(3500, Wait{})
		sv.End(3500)
	}
	if tr := sv.Trust(3500); tr < 0.95 {
		t.Errorf("trust after 100 agreeing answers: %.2f", tr)
	}
	if got := shares(w.build(2000), 2000)["hostile"]; got < before-0.05 {
		t.Errorf("after agreeing again the site draws %.2f, was %.2f", got, before)
	}
}

// waitedFrom500 is the wait of a request sent at 500 whose first token
// came at 3500: certainly in the queue from 600 (its least time to first
// token after it was sent) to 3400.
var waitedFrom500 = Wait{FromMs: 600, ToMs: 3400}

// TestQueueShownIsNoContradiction: a site whose readings show the queue a
// request waited in told the truth, and keeps its trust.
func TestQueueShownIsNoContradiction(t *testing.T) {
	w := newWorld(t, "west")
	w.ageAware, w.meanMs = true, 1000
	w.served = map[string]*Served{"west": {}}
	w.publish("west", 1000, obs{running: 16, queue: f(0)})
	w.build(1000)
	w.publish("west", 2000, obs{running: 16, queue: f(6)})
	w.build(2000)
	sv := w.served["west"]
	for range 40 {
		sv.Begin(1500)
		sv.Judge(3500, waitedFrom500)
		sv.End(3500)
	}
	if tr := sv.Trust(3500); tr != 1 {
		t.Errorf("a site that showed its queue: trust %.2f", tr)
	}
}

// TestCeilingFloorPerReadyUnit: before traffic has shown a site's capacity,
// the floor is credited per ready unit, so a cold start splits by them: a
// pool of four ready endpoints beside one of one draws four fifths, where
// both read as one floor drew half each and the small one queued.
func TestCeilingFloorPerReadyUnit(t *testing.T) {
	w := newWorld(t, "small", "large")
	w.ageAware, w.meanMs = true, 1000
	w.publish("small", 1000, obs{running: 0, ready: 1, queue: f(0)})
	w.publish("large", 1000, obs{running: 0, ready: 4, queue: f(0)})
	snap := w.build(1000)
	if c := find(snap, "large"); c.Ceiling != 4*w.set.CeilingFloor {
		t.Errorf("four ready endpoints: ceiling %g, want %g", c.Ceiling, 4*w.set.CeilingFloor)
	}
	if c := find(snap, "small"); c.Ceiling != w.set.CeilingFloor {
		t.Errorf("one ready endpoint: ceiling %g, want %g", c.Ceiling, w.set.CeilingFloor)
	}
	large := 0
	for turn := range uint64(1000) {
		if p := snap.Pick("m", turn, 1000+int64(turn)*100); p.Candidate.Site == "large" {
			large++
		}
	}
	if got := float64(large) / 1000; math.Abs(got-0.8) > 0.05 {
		t.Errorf("the four-endpoint pool drew %.2f, want about 0.8", got)
	}
}

// TestDistrustFades: a site read at its floor is sent next to nothing and
// could not show that it mended; its contradicted share fades by half
// every 10 s without answers, and its trust comes back with it.
func TestDistrustFades(t *testing.T) {
	var sv Served
	sv.claim(2000, true)
	for range 60 {
		sv.Begin(1500)
		sv.Judge(3500, waitedFrom500)
		sv.End(3500)
	}
	if tr := sv.Trust(3500); tr > 0.1 {
		t.Fatalf("trust after 60 contradicted answers: %.2f", tr)
	}
	share := 1 - math.Pow(1-answerWeight, 60)
	if tr := sv.Trust(3500 + forgiveHalfLifeMs); math.Abs(tr-max(1-distrustGain*share/2, minTrust)) > 1e-9 {
		t.Errorf("a half-life later the distrust should halve: trust %.3f", tr)
	}
	if tr := sv.Trust(3500 + 7*forgiveHalfLifeMs); tr < 0.95 {
		t.Errorf("five half-lives later: trust %.2f", tr)
	}
}

// TestCapacityFollowsReadyUnits: the bounds are learned per ready unit and
// read at the latest ready count, so a pool that loses half its endpoints
// is read at half its capacity from the reading that says so, and at the
// whole again when they return. Learned for the whole site, the ceiling
// stayed at 40 until a backlog at 20 running taught the hard bound, and
// grid bench routing --scenario capacity-drop read a p99 wait of 1.58
// mean durations against the oracle's 1.16 (1.35 since).
func TestCapacityFollowsReadyUnits(t *testing.T) {
	w := newWorld(t, "a")
	w.publish("a", 1000, obs{running: 10, ready: 4, queue: f(0)})
	if c := find(w.build(1000), "a"); c.Ceiling != 40 {
		t.Fatalf("four endpoints each running 10: ceiling %g, want 40", c.Ceiling)
	}
	w.publish("a", 2000, obs{running: 10, ready: 2, queue: f(0)})
	if c := find(w.build(2000), "a"); c.Ceiling != 20 || c.RawRho != 1 {
		t.Errorf("two of the four endpoints left: ceiling %g raw rho %g, want 20 and 1 (both still running 10)", c.Ceiling, c.RawRho)
	}
	w.publish("a", 9000, obs{running: 1, ready: 4, queue: f(0)})
	if c := find(w.build(9000), "a"); c.Ceiling != 40 {
		t.Errorf("the endpoints returned: ceiling %g, want 40 again", c.Ceiling)
	}
}

// TestColdStartDrawsOnSitesNotYetRead: a gateway that has read one site
// and not yet the other (its readings arrive one by one after a start)
// splits a burst between them by capacity, the unread one at the ceiling
// floor, with its own sends counted; it does not pour the burst into the
// site read first. Past the load window the unread site is unmeasured
// again, a last resort: its load is unknown, not idle.
func TestColdStartDrawsOnSitesNotYetRead(t *testing.T) {
	w := newWorld(t, "read", "unread")
	w.ageAware, w.meanMs = true, 1000
	w.publish("read", 1000, obs{running: 0, ready: 1, queue: f(0)})
	snap := w.build(1000)
	c := find(snap, "unread")
	if c.Measured || c.Ceiling != w.set.CeilingFloor {
		t.Fatalf("unread site: measured %v, ceiling %g; want unmeasured at the floor %g", c.Measured, c.Ceiling, w.set.CeilingFloor)
	}
	if _, ok := c.ReadingAt(); ok {
		t.Error("an assumed site reports a reading")
	}
	got := map[string]int{}
	for turn := range uint64(16) {
		got[snap.Pick("m", turn, 1000).Candidate.Site]++
	}
	if got["unread"] < 7 || got["unread"] > 9 {
		t.Errorf("a burst of 16 at two sites of 8 (one not yet read): %v, want about 8 each", got)
	}

	// The window passes with no reading of it: a last resort.
	w.publish("read", 1500, obs{running: 0, ready: 1, queue: f(0)})
	snap = w.build(1000 + w.set.WindowMs)
	for turn := range uint64(100) {
		if s := snap.Pick("m", turn, snap.BuiltAt).Candidate.Site; s != "read" {
			t.Fatalf("a site unread for the load window drawn while a measured one has room (turn %d)", turn)
		}
	}
}

// TestFullByTheOwnCount: Snapshot.Full says every site is full when, by
// this gateway's own count (ownHeld), one more request would wait in each
// one's queue, and no sooner; a site whose slot one of the gateway's
// requests freed has room at once, before any reading shows it.
func TestFullByTheOwnCount(t *testing.T) {
	world := func(readA, readB float64, heldA, heldB int) (*Snapshot, *world) {
		return heldWorld(t, nil, readA, readB, heldA, heldB)
	}
	// Half of each site's 32 are this gateway's, the rest another's: k
	// is 2, and both sites hold 32.
	snap, w := world(32, 32, 16, 16)
	if !snap.Full("m", 2100) {
		t.Fatal("both sites hold their 32: want full")
	}
	// One of its requests at a ends: a has a slot (k × 15 = 30, with
	// room for one more), though no reading shows it yet.
	w.served["a"].End(2150)
	if snap.Full("m", 2200) {
		t.Error("a request ended at a: want room")
	}
	snap, _ = world(30, 32, 15, 16)
	if snap.Full("m", 2100) {
		t.Error("a holds 30 of 32: want room")
	}
	// A client sending to b directly keeps b full whatever this gateway
	// holds there: the reading's excess persists.
	snap, w = world(32, 44, 16, 10)
	if !snap.Full("m", 2100) {
		t.Error("a holds 32, b 20 of ours and 24 from outside: want full")
	}
	w.served["b"].End(2150)
	if !snap.Full("m", 2200) {
		t.Error("b's reading shows a backlog, whose queue takes the slot: want full still")
	}
	// A site whose reading shows a queue has no room for a held request
	// even where the count has: two of this gateway's requests at b
	// ended, but the slots they freed go to b's queue.
	snap, w = world(32, 34, 16, 16)
	w.served["b"].End(2150)
	w.served["b"].End(2150)
	if !snap.Full("m", 2200) {
		t.Error("b's reading shows a queue of 2: want full though two of ours there ended")
	}
	// Those clients' requests are read as the gateways' nowhere else: a
	// holds 12 of ours and 24 in all, with 8 slots free, though the
	// readings' 68 over our 22 would read it as holding 37.
	if snap, _ := world(24, 44, 12, 10); snap.Full("m", 2100) {
		t.Error("a holds 24 of 32, b a backlog from outside: want room at a")
	}
	// Holding fewer than ownInformed, the gateway cannot tell: never full.
	if snap, _ := world(40, 40, 3, 3); snap.Full("m", 2100) {
		t.Error("holding 6 requests, the count says too little: want not full")
	}
	// A model nobody serves is not full; neither is one under the
	// reference policy, which counts nothing.
	snap, _ = world(32, 32, 16, 16)
	if snap.Full("other", 2100) {
		t.Error("an unknown model read as full")
	}
	// Asking counts nothing, and costs no allocation.
	before := snap.Pick("m", 7, 2100)
	if a := testing.AllocsPerRun(100, func() { snap.Full("m", 2100) }); a != 0 {
		t.Errorf("Full allocates %v times", a)
	}
	if after := snap.Pick("m", 7, 2100); after.Candidate.Site != before.Candidate.Site {
		t.Errorf("asking whether full moved a pick: %s then %s", before.Candidate.Site, after.Candidate.Site)
	}
}
