package loadstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/signals"
)

func line(name, site, prov string, v float64, stamp int64, extra ...string) string {
	ls := append([]string{fmt.Sprintf(`grid_provider=%q`, prov), fmt.Sprintf(`grid_site=%q`, site)}, extra...)
	return fmt.Sprintf("%s{%s} %g %d\n", name, strings.Join(ls, ","), v, stamp)
}

func meta(site, prov string, epoch, seq, samples, stamp int64) string {
	return line(signals.ConfigGeneration, site, prov, 1, stamp,
		fmt.Sprintf(`batch_samples="%d"`, samples), fmt.Sprintf(`batch_sequence="%d"`, seq),
		`provider_uid="u"`, fmt.Sprintf(`publisher_epoch="%d"`, epoch))
}

func TestIngestRules(t *testing.T) {
	s := New(time.Minute)
	const now = 1_000_000
	body := line(signals.Ready, "east", "a", 1, now-500) +
		line(signals.Ready, "east", "future", 1, now+2000) + // skew
		line(signals.Ready, "east", "old", 1, now-2*86_400_000) + // skew
		line("go_goroutines", "east", "a", 1, now) + // name
		line(signals.Ready, "east", "Bad_P", 1, now) + // provider
		line(signals.Ready, "east", "a", 2, now) + // value
		"not a line\n" // parse
	res := s.Ingest([]byte(body), now, now, now, signals.Origin{Site: "east", Relay: true})
	var want signals.Tally
	want.Add(signals.RefuseAge, 2)
	want.Add(signals.RefuseName, 1)
	want.Add(signals.RefuseProvider, 1)
	want.Add(signals.RefuseValue, 1)
	want.Add(signals.RefuseParse, 1)
	if res.Refused != want {
		t.Errorf("refused %v, want %v", res.Refused, want)
	}
	v, ok := s.View(Key{"east", "a"})
	if !ok || len(v.Series[signals.Ready]) != 1 || v.Series[signals.Ready][0].At != now-500 {
		t.Fatalf("view %+v", v)
	}
	// A remote owner may not speak for another site.
	res = s.Ingest([]byte(line(signals.Ready, "north", "x", 1, now)), now, now, now, signals.Origin{Site: "west"})
	if res.Refused[signals.RefuseSite] != 1 {
		t.Errorf("site mismatch not refused: %v", res.Refused)
	}
}

func TestFoldSumAndMax(t *testing.T) {
	s := New(time.Minute)
	body := line(signals.EPPFlowControlQueue, "e", "a", 3, 1000, `priority="0"`) +
		line(signals.EPPFlowControlQueue, "e", "a", 4, 1000, `priority="1"`) +
		line(signals.EPPPerEndpointQueue, "e", "a", 2, 1000, `model_server_endpoint="x"`) +
		line(signals.EPPPerEndpointQueue, "e", "a", 5, 1000, `model_server_endpoint="y"`)
	s.Ingest([]byte(body), 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
	// The same rows again (a republish of the same instant) change nothing.
	s.Ingest([]byte(body), 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
	v, _ := s.View(Key{"e", "a"})
	if got := v.Series[signals.EPPFlowControlQueue]; len(got) != 1 || got[0].Value != 7 {
		t.Errorf("flow control %+v, want one sample summing to 7", got)
	}
	if got := v.Series[signals.EPPPerEndpointQueue]; len(got) != 1 || got[0].Value != 5 {
		t.Errorf("per-endpoint %+v, want the max 5", got)
	}
}

func TestBatchFenceAndLearning(t *testing.T) {
	s := New(time.Minute)
	k := Key{"e", "a"}
	ingest := func(epoch, seq, samples, stamp int64, rows int) Result {
		var b strings.Builder
		for i := range rows {
			b.WriteString(line(signals.InFlight, "e", "a", float64(i), stamp, fmt.Sprintf(`i="%d"`, i)))
		}
		b.WriteString(meta("e", "a", epoch, seq, samples, stamp))
		return s.Ingest([]byte(b.String()), stamp, stamp, stamp, signals.Origin{Site: "e", Relay: true})
	}
	view := func() View { v, _ := s.View(k); return v }

	ingest(1000, 5, 1, 1000, 1)
	if v := view(); !v.Learnable || v.Generation != 0 {
		t.Fatalf("complete batch: %+v", v)
	}
	// An incomplete batch (claims 3 samples, carries 1) disables learning.
	ingest(1000, 6, 3, 2000, 1)
	if view().Learnable {
		t.Error("incomplete batch is learnable")
	}
	// A zero-sample batch invalidates learning too.
	ingest(1000, 7, 0, 3000, 0)
	if view().Learnable {
		t.Error("empty batch is learnable")
	}
	// A delayed (older) batch is dropped whole.
	if res := ingest(1000, 4, 1, 4000, 1); res.Refused[signals.RefuseDelayed] != 2 {
		t.Errorf("delayed batch: %v", res.Refused)
	}
	// The same batch again is a republish: neither stored nor counted.
	if res := ingest(1000, 7, 0, 3000, 0); res.Refused.Total() != 0 || res.Kept != 0 {
		t.Errorf("republish: %+v", res)
	}
	// An epoch more than ten minutes ahead is refused and keeps no fence.
	if res := ingest(5000+11*60_000, 1, 1, 5000, 1); res.Refused[signals.RefuseEpoch] != 2 {
		t.Errorf("future epoch: %v", res.Refused)
	}
	// A new epoch (a publisher restart) resets learning identity.
	ingest(2000, 1, 1, 6000, 1)
	if v := view(); v.Generation != 1 || !v.Learnable {
		t.Errorf("new epoch: %+v", v)
	}
}

func TestCaps(t *testing.T) {
	s := New(time.Minute)
	var b strings.Builder
	for i := range signals.MaxPeerProviders + 6 {
		b.WriteString(line(signals.Ready, "e", fmt.Sprintf("p%03d", i), 1, 1000))
	}
	res := s.Ingest([]byte(b.String()), 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
	if res.Refused[signals.RefuseProviderCap] != 6 || len(s.Keys()) != signals.MaxPeerProviders {
		t.Errorf("refused %v, keys %d", res.Refused, len(s.Keys()))
	}
}

func TestWindowEviction(t *testing.T) {
	s := New(10 * time.Second)
	for i := range 200 {
		ts := int64(1000 + i*100)
		s.Ingest([]byte(line(signals.InFlight, "e", "a", float64(i), ts)), ts, ts, ts, signals.Origin{Site: "e", Relay: true})
	}
	v, _ := s.View(Key{"e", "a"})
	got := v.Series[signals.InFlight]
	if len(got) > MaxSamplesPerSerie || got[0].At < got[len(got)-1].At-10_000 {
		t.Errorf("%d samples from %d to %d", len(got), got[0].At, got[len(got)-1].At)
	}
}

// TestTimelineIgnoresWallSteps: the timeline moves with elapsed time only.
// A wall step back an hour or forward a day (NTP, a date command) neither
// moves it back, so held rows would look younger, nor forward, so they would
// look older; the rows it stores keep their ages across the step.
func TestTimelineIgnoresWallSteps(t *testing.T) {
	clk := clock.NewFake(time.UnixMilli(1_000_000_000))
	tl := NewTimeline(clk)
	s := New(time.Hour)
	now := tl.NowMs()
	s.Ingest([]byte(line(signals.InFlight, "e", "a", 3, 1_000_000_000-2000)), 1_000_000_000, now, now, signals.Origin{Site: "e", Relay: true})
	clk.Advance(time.Second)
	for _, step := range []time.Duration{-time.Hour, 24 * time.Hour, -24 * time.Hour} {
		clk.StepWall(step)
		if got := tl.NowMs(); got != 1_000_001_000 {
			t.Fatalf("after a wall step of %v the timeline reads %d, want 1000001000", step, got)
		}
	}
	if clk.Now().UnixMilli() == 1_000_001_000 {
		t.Fatal("the wall clock did not step")
	}
	clk.Advance(time.Second)
	if got := tl.NowMs(); got != 1_000_002_000 {
		t.Fatalf("a second later the timeline reads %d, want 1000002000", got)
	}
	v, _ := s.View(Key{"e", "a"})
	if got := tl.NowMs() - v.Series[signals.InFlight][0].At; got != 4000 {
		t.Errorf("the row's age after the steps is %d ms, want 4000", got)
	}
}

func FuzzIngest(f *testing.F) {
	f.Add([]byte(line(signals.Ready, "e", "a", 1, 1000) + meta("e", "a", 1, 1, 1, 1000)))
	f.Fuzz(func(t *testing.T, body []byte) {
		s := New(time.Minute)
		s.Ingest(body, 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
		for _, k := range s.Keys() {
			v, _ := s.View(k)
			if len(v.Series) > MaxMetricsPerKey {
				t.Fatalf("%d series", len(v.Series))
			}
		}
	})
}

// TestForget: a key whose newest row is older than the cutoff leaves the
// store with its fence and its place under the caps; a key still relayed
// stays, however old its other series.
func TestForget(t *testing.T) {
	s := New(time.Minute)
	s.Ingest([]byte(meta("w", "gone", 1000, 9, 0, 1000)+line(signals.Info, "w", "gone", 1, 1000, `model="m"`)), 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
	s.Ingest([]byte(line(signals.Ready, "w", "live", 1, 1000)), 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
	s.Ingest([]byte(line(signals.InFlight, "w", "live", 3, 500_000)), 500_000, 500_000, 500_000, signals.Origin{Site: "e", Relay: true})

	if gone := s.Forget(400_000); len(gone) != 1 || gone[0] != (Key{"w", "gone"}) {
		t.Fatalf("forgot %v, want w/gone only", gone)
	}
	if got := s.Keys(); len(got) != 1 || got[0] != (Key{"w", "live"}) {
		t.Errorf("keys after forgetting: %v", got)
	}
	// The provider returns (a new publisher, an older sequence): its key
	// starts afresh, no fence from before refuses it.
	res := s.Ingest([]byte(meta("w", "gone", 900, 1, 0, 600_000)), 600_000, 600_000, 600_000, signals.Origin{Site: "e", Relay: true})
	if res.Refused.Total() != 0 {
		t.Errorf("a returning provider was refused: %v", res.Refused)
	}
	if v, ok := s.View(Key{"w", "gone"}); !ok || v.Model != "" {
		t.Errorf("returning provider %+v: want a fresh key without the old model", v)
	}

	// Forgetting frees the per-site cap.
	full := New(time.Minute)
	for i := range MaxKeysPerSite { // one answer carries at most signals.MaxPeerProviders
		full.Ingest([]byte(line(signals.Ready, "x", fmt.Sprintf("p%03d", i), 1, 1000)), 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
	}
	if res := full.Ingest([]byte(line(signals.Ready, "x", "new", 1, 2000)), 2000, 2000, 2000, signals.Origin{Site: "e", Relay: true}); res.Refused[signals.RefuseStoreCap] != 1 {
		t.Fatalf("cap not reached: %v", res.Refused)
	}
	full.Forget(1500)
	if res := full.Ingest([]byte(line(signals.Ready, "x", "new", 1, 2000)), 2000, 2000, 2000, signals.Origin{Site: "e", Relay: true}); res.Refused.Total() != 0 || len(full.Keys()) != 1 {
		t.Errorf("after forgetting, refused %v, keys %d", res.Refused, len(full.Keys()))
	}
}

// TestIdentityAndLearningGate: a new configuration generation or provider
// uid in the same publisher epoch is a new provider identity (learning
// starts over); a batch without metadata is read but teaches nothing; the
// same complete publication again keeps what was held, learnable, with its
// first sample's time (docs/protocol.md §4.9).
func TestIdentityAndLearningGate(t *testing.T) {
	s := New(time.Minute)
	k := Key{"e", "a"}
	view := func() View { v, _ := s.View(k); return v }
	batch := func(generation float64, uid string, seq, stamp int64, withMeta bool) Result {
		body := line(signals.InFlight, "e", "a", 3, stamp)
		if withMeta {
			body += line(signals.ConfigGeneration, "e", "a", generation, stamp,
				`batch_samples="1"`, fmt.Sprintf(`batch_sequence="%d"`, seq), fmt.Sprintf(`provider_uid=%q`, uid), `publisher_epoch="1000"`)
		}
		return s.Ingest([]byte(body), stamp, stamp, stamp, signals.Origin{Site: "e", Relay: true})
	}
	batch(1, "u", 1, 1000, true)
	if v := view(); !v.Learnable || v.Generation != 0 {
		t.Fatalf("first complete batch: learnable %v, identity %d", v.Learnable, v.Generation)
	}
	// The same publication again, received later: what is held stays.
	if res := batch(1, "u", 1, 1000, true); res.Kept != 0 || res.Refused.Total() != 0 {
		t.Errorf("republish: %+v, want neither kept nor refused", res)
	}
	if v := view(); !v.Learnable || len(v.Series[signals.InFlight]) != 1 || v.Series[signals.InFlight][0].At != 1000 {
		t.Errorf("after a republish: learnable %v, in-flight %v; want the first publication, learnable", v.Learnable, v.Series[signals.InFlight])
	}
	batch(2, "u", 2, 2000, true)
	if v := view(); v.Generation != 1 || !v.Learnable {
		t.Errorf("a new configuration generation: identity %d, learnable %v; want a new identity", v.Generation, v.Learnable)
	}
	batch(2, "u2", 3, 3000, true)
	if v := view(); v.Generation != 2 {
		t.Errorf("a new provider uid: identity %d, want a new one", v.Generation)
	}
	batch(2, "u2", 0, 4000, false)
	if v := view(); v.Learnable || len(v.Series[signals.InFlight]) != 4 {
		t.Errorf("a batch without metadata: learnable %v, %d in-flight samples; want read, not learnable", v.Learnable, len(v.Series[signals.InFlight]))
	}
}

// TestOnePublicationFoldsToItsLargest: the rows of one series in one
// publication (several producers, label sets apart) fold into one sample,
// the largest of them whatever their order (docs/protocol.md §4.8); the
// flow-control queue sums its partitions instead.
func TestOnePublicationFoldsToItsLargest(t *testing.T) {
	s := New(time.Minute)
	body := line(signals.EPPAverageRunning, "e", "a", 5, 1000, `name="p",producer="x"`) +
		line(signals.EPPAverageRunning, "e", "a", 3, 1000, `name="p",producer="y"`) +
		line(signals.EPPFlowControlQueue, "e", "a", 2, 1000, `name="p",partition="1"`) +
		line(signals.EPPFlowControlQueue, "e", "a", 4, 1000, `name="p",partition="2"`)
	s.Ingest([]byte(body), 1000, 1000, 1000, signals.Origin{Site: "e", Relay: true})
	v, _ := s.View(Key{"e", "a"})
	if got := v.Series[signals.EPPAverageRunning]; len(got) != 1 || got[0].Value != 5 {
		t.Errorf("running folded to %v, want one sample of the largest, 5", got)
	}
	if got := v.Series[signals.EPPFlowControlQueue]; len(got) != 1 || got[0].Value != 6 {
		t.Errorf("flow-control queue folded to %v, want the sum, 6", got)
	}
}
