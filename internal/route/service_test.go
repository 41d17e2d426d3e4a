package route

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestServiceTimeIgnoresAHerd: the age unit is the least recent window's
// mean of requests sent with room; a herd that sets in (durations five
// times longer) does not make readings look younger until the windows
// before it have aged out, requests sent without room teach nothing, and a
// lasting change is learned in the end.
func TestServiceTimeIgnoresAHerd(t *testing.T) {
	var s ServiceTime
	if got := s.MeanMs(); got != DefaultServiceMs {
		t.Fatalf("before any request: %v ms, want the prior %v", got, DefaultServiceMs)
	}
	s.Observe(800, true)
	s.Observe(1200, true)
	if got := s.MeanMs(); got != 1000 {
		t.Fatalf("two requests: %v ms, want their mean 1000", got)
	}
	for range 2*serviceWindow - 2 {
		s.Observe(1000, true)
	}
	for range 1000 {
		s.Observe(60_000, false) // waited behind a queue the pick saw
	}
	if got := s.MeanMs(); got != 1000 {
		t.Fatalf("after requests without room: %v ms, want 1000", got)
	}
	for range (serviceWindows - 2) * serviceWindow {
		s.Observe(5000, true) // a herd: requests wait though the pick saw room
	}
	if got := s.MeanMs(); got != 1000 {
		t.Errorf("during a herd: %v ms, want 1000 (the windows before it)", got)
	}
	for range 2 * serviceWindow {
		s.Observe(5000, true)
	}
	if got := s.MeanMs(); got != 5000 {
		t.Errorf("once every window is longer: %v ms, want 5000 (a lasting change is learned)", got)
	}
}

// TestServiceTimeStreamsSeeNoQueue: a stream's wait comes before its first
// token, so a herd that makes most requests wait (five seconds to first
// token instead of 50 ms; the few sent elsewhere do not) teaches nothing:
// the unit stays decode plus the least recent time to first token, however
// long the herd lasts.
func TestServiceTimeStreamsSeeNoQueue(t *testing.T) {
	var s ServiceTime
	for range serviceWindow {
		s.ObserveStream(50, 950)
	}
	if got := s.MeanMs(); got != 1000 {
		t.Fatalf("streams without a wait: %v ms, want 1000", got)
	}
	for i := range 20 * serviceWindow {
		if i%10 == 0 {
			s.ObserveStream(50, 950)
		} else {
			s.ObserveStream(5050, 950) // waited five seconds in a queue
		}
	}
	if got := s.MeanMs(); got > 1100 {
		t.Errorf("during a long herd: %v ms, want about 1000 (decode plus the least first token)", got)
	}
	var fresh ServiceTime
	for range serviceWindow {
		fresh.ObserveStream(5050, 950) // the herd from the start
	}
	if got := fresh.MeanMs(); got > 6000 {
		t.Errorf("a herd from the first request: %v ms, want at most the whole duration", got)
	}
}

// TestServiceTimeForgetsAZeroFirstToken: a first token at once (0 ms, as a
// simulated engine with no prefill answers) is a time to first token like
// any other, forgotten when its windows are: engines that later take 200 ms
// to their first token are read in decode plus 200 ms.
func TestServiceTimeForgetsAZeroFirstToken(t *testing.T) {
	var s ServiceTime
	for range serviceWindow {
		s.ObserveStream(0, 950)
	}
	if got := s.MeanMs(); got != 950 {
		t.Fatalf("streams with an instant first token: %v ms, want 950", got)
	}
	for range (serviceWindows + 2) * serviceWindow {
		s.ObserveStream(200, 950)
	}
	if got := s.MeanMs(); got != 1150 {
		t.Errorf("after the first tokens slowed to 200 ms: %v ms, want 1150", got)
	}
}

// TestSitePaceOnlyWhenTellable: a site is read in its own unit only once
// its requests can be told apart from all of the gateway's. Durations
// drawn from one exponential law at every site teach no site a pace of its
// own (its estimate from a share of the requests is noise, and a pace a few
// percent fast overfills the site at load 0.9). Once one site is four
// times slower it is read at four times the pace of the others, which are
// then told apart from the mix too.
func TestSitePaceOnlyWhenTellable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var all ServiceTime
	sites := make([]ServiceTime, 5)
	for range 8 * serviceWindows * serviceWindow {
		i := rng.IntN(len(sites))
		ms := 1000 * rng.ExpFloat64()
		sites[i].ObserveStream(0, ms)
		all.ObserveStream(0, ms)
	}
	for i := range sites {
		if ms, ok := SitePace(&all, &sites[i]); ok {
			t.Errorf("site %d, paced as all the others: its own unit %.0f ms, want none", i, ms)
		}
	}
	var slow ServiceTime
	for range 8 * serviceWindows * serviceWindow {
		i := rng.IntN(len(sites) + 1)
		if i == len(sites) {
			ms := 4000 * rng.ExpFloat64()
			slow.ObserveStream(0, ms)
			all.ObserveStream(0, ms)
			continue
		}
		ms := 1000 * rng.ExpFloat64()
		sites[i].ObserveStream(0, ms)
		all.ObserveStream(0, ms)
	}
	slowMs, ok := SitePace(&all, &slow)
	if !ok {
		t.Fatal("a site four times slower: no pace of its own")
	}
	for i := range sites {
		ms, ok := SitePace(&all, &sites[i])
		if !ok {
			t.Errorf("site %d beside a slow one: no pace of its own", i)
			continue
		}
		if ratio := slowMs / ms; ratio < 3.4 || ratio > 4.6 {
			t.Errorf("site %d: the slow site's pace %.0f ms is %.1f× its %.0f ms, want about 4×", i, slowMs, ratio, ms)
		}
	}
	var young ServiceTime
	for range serviceWindow - 1 {
		young.ObserveStream(0, 4000*rng.ExpFloat64())
	}
	if _, ok := SitePace(&all, &young); ok {
		t.Error("a site without a full window: a pace of its own, want none")
	}
	young.ObserveStream(0, 4000*rng.ExpFloat64())
	if _, ok := SitePace(&all, &young); !ok {
		t.Error("a site four times slower, after one window: no pace of its own")
	}
}

// TestDistantPeersShortAnswerIsNoWait: a whole answer from a peer 120 ms
// away, before the peer's own pace can be told apart, is judged in the
// unit of all answers (this site's 50 ms embeddings), which holds no round
// trip. The 170 ms it took is its service and the round trip, not a wait
// that would contradict the peer's board; an answer that did wait half a
// second beyond them still reads as one.
func TestDistantPeersShortAnswerIsNoWait(t *testing.T) {
	var s Service
	for range serviceWindows * serviceWindow {
		s.Observe("here", 50, true)
	}
	s.RoundTrip("far").Observe(120)
	if w := s.Waited("far", false, 10_000, 50+120, 50+120, Cost{}); w.FromMs < w.ToMs {
		t.Errorf("a 50 ms answer 120 ms away read as a wait %v", w)
	}
	if w := s.Waited("far", false, 10_000, 50+120+500, 50+120+500, Cost{}); !(w.FromMs < w.ToMs) {
		t.Errorf("an answer that waited 500 ms read as no wait %v", w)
	}
}

// TestStreamIsJudgedByItsWaitNotItsDecode: a stream waited before its
// first token, and the readings that its wait disproves are the ones
// taken then. West's streams begin 20 ms after they are sent and decode
// for a second; one sent at 8,180 whose first token came at 9,000 waited
// in the queue at least from 8,200 to 8,980. A reading taken at 8,500
// that said west had room and nothing queued is contradicted; one taken
// at 9,500, while the answer was decoding (where the rule once looked:
// from a unit after the wait began to the answer's end), is not. A first
// token 100 ms late is within what prefill and batching vary by, and one
// 300 ms late from a peer 400 ms away within what the path does: neither
// is judged.
func TestStreamIsJudgedByItsWaitNotItsDecode(t *testing.T) {
	var s Service
	for range serviceWindows * serviceWindow {
		s.ObserveStream("west", 20, 1000)
	}
	w := s.Waited("west", true, 8_180, 820, 820, Cost{})
	if w.FromMs > 8200 || w.ToMs < 8980 || w.ToMs > 9000 {
		t.Fatalf("a stream sent at 8180, first token at 9000: judged in %v, want about [8200, 8980]", w)
	}
	if late := s.Waited("west", true, 8_180, 120, 120, Cost{}); late.FromMs < late.ToMs {
		t.Errorf("a first token 100 ms late read as a wait %v", late)
	}
	// From a peer 400 ms away, 300 ms late is the path's to vary by.
	s.RoundTrip("west").Observe(400)
	if far := s.Waited("west", true, 8_180, 320, 320, Cost{}); far.FromMs < far.ToMs {
		t.Errorf("a first token 300 ms late from a peer 400 ms away read as a wait %v", far)
	}

	var lied, told Served
	lied.claim(8500, true)
	lied.claim(9500, true)
	told.claim(8500, false) // showed the queue
	told.claim(9500, true)  // room again while the answer decoded
	for _, sv := range []*Served{&lied, &told} {
		sv.Begin(1500)
		sv.Judge(10_000, w)
		sv.End(3500)
	}
	if tr := lied.Trust(10_000); tr == 1 {
		t.Errorf("a board that said room while the stream waited kept trust %.2f", tr)
	}
	if tr := told.Trust(10_000); tr != 1 {
		t.Errorf("a board that showed the queue, and room after it, lost trust: %.2f", tr)
	}
}

// TestServedHeldAtAReadingsInstant: what a site held of this gateway's
// requests when a reading was taken is read from the count's history at
// the reading's instant, not at its arrival: a remote reading arrives
// about a second late, and the requests sent meanwhile are not in it.
func TestServedHeldAtAReadingsInstant(t *testing.T) {
	var sv Served
	for range 3 {
		sv.Begin(10_000)
	}
	for range 5 {
		sv.Begin(11_000) // after the reading at 10 500, before it arrives
	}
	sv.End(11_500)
	for _, c := range []struct {
		atMs int64
		want float64
	}{
		{10_000, 3},
		{10_500, 3}, // the reading's instant
		{11_050, 8}, // the slot of the sends
		{11_900, 7}, // after the end
		{40_000, 7}, // nothing since: the count now
		{9_000, 3},  // before the history: the first count after
		{-1_000, 3}, // long before it
	} {
		if got := sv.heldAt(c.atMs); got != c.want {
			t.Errorf("held at %d: %g, want %g", c.atMs, got, c.want)
		}
	}
	// Thirteen seconds of sends later the history of 10 500 is written
	// over: the nearest count kept stands for it.
	for ms := int64(12_000); ms <= 25_000; ms += heldSlotMs {
		sv.Begin(ms)
		sv.End(ms)
	}
	if got := sv.heldAt(10_500); got != 7 && got != 8 {
		t.Errorf("held at a reading older than the history: %g, want 7 or 8", got)
	}
}

// TestServedHistoryKeepsTheLastCount: writers that overtake one another
// within a slot leave the count after the slot's last change.
func TestServedHistoryKeepsTheLastCount(t *testing.T) {
	var sv Served
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				sv.Begin(5_000)
				sv.End(5_000)
			}
			sv.Begin(5_000)
		})
	}
	wg.Wait()
	if got := sv.heldAt(5_000); got != 8 {
		t.Errorf("held after 8 writers each left one: %g", got)
	}
}

// TestServiceOnTheRequestPathAllocatesNothing: what the proxy asks of the
// observed service for each request (a site's count and its waits, its
// round trip and pace, what the answer taught) allocates nothing once the
// site is known, and a site the topology drops is forgotten while the
// others keep what they learned, each under the same pointer.
func TestServiceOnTheRequestPathAllocatesNothing(t *testing.T) {
	var s Service
	held := s.Served("west", "m")
	s.RoundTrip("west").Observe(30)
	s.Observe("west", 900, true)
	s.Waits("east")
	var now int64
	if n := testing.AllocsPerRun(1000, func() {
		now += 10
		sv := s.Served("west", "m")
		sv.Begin(now)
		s.Waits("west")
		s.RoundTripMs("west")
		s.SiteMs("west")
		s.AtSiteMs("west", 500)
		sv.Judge(now, s.Waited("west", true, float64(now)-500, 500, 500, Cost{}))
		s.Waits("west").Observe(0.5, 20)
		s.Costs().Observe(Cost{}, 470, 600, true)
		s.Observe("west", 900, true)
		s.ObserveStream("west", 300, 600)
		sv.End(now)
	}); n != 0 {
		t.Errorf("the request path's service calls: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { s.Retain(func(string) bool { return true }) }); n != 0 {
		t.Errorf("a Retain that drops nothing: %v allocations, want 0 (it runs on every snapshot build)", n)
	}
	s.Retain(func(site string) bool { return site == "west" })
	if _, ok := s.waits.lookup("east"); ok {
		t.Error("east's waits kept after the topology dropped east")
	}
	if s.Served("west", "m") != held {
		t.Error("west's count made anew by a Retain that keeps west: its requests in flight are lost")
	}
	if _, ok := s.RoundTripMs("west"); !ok {
		t.Error("west's round trip forgotten by a Retain that keeps west")
	}
}

// TestTableMakesOneValuePerKey: goroutines that ask for the same keys at
// once all get the one value each key was made with.
func TestTableMakesOneValuePerKey(t *testing.T) {
	var tb table[int, int]
	const keys, workers = 64, 8
	got := make([][keys]*int, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				got[w][(k+w)%keys] = tb.get((k + w) % keys)
			}
		})
	}
	wg.Wait()
	for k := range keys {
		for w := 1; w < workers; w++ {
			if got[w][k] != got[0][k] {
				t.Fatalf("key %d: worker %d got another value than worker 0", k, w)
			}
		}
	}
}
