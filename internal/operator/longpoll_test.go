package operator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLongPoll: a read that asks to wait is answered when the board moves
// past its cursor, or when its wait ends (on the operator's clock, rung by
// the bell); without a wait, or with an older cursor, at once; a second
// wait of the same caller ends the first; stopping ends every wait; the
// cursor is read before the rows, so a change made while an answer is
// written moves the board past it; with long polls off, no wait and no
// cursor.
func TestLongPoll(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	op := newPeeringOperatorOn(t, clk, "hub", "east")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go op.waits.ring(ctx, clk)
	own, err := op.id.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	read := func(query, remote string) chan *httptest.ResponseRecorder {
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			r := httptest.NewRequest(http.MethodGet, signals.SignalsPath+query, nil)
			r.RemoteAddr = remote
			r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{own.Certificates[0]}}
			rec := httptest.NewRecorder()
			op.SignalsHandler().ServeHTTP(rec, r)
			done <- rec
		}()
		return done
	}
	answered := func(c chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
		t.Helper()
		select {
		case rec := <-c:
			return rec
		case <-time.After(5 * time.Second):
			t.Fatal("not answered")
			return nil
		}
	}
	pending := func(c chan *httptest.ResponseRecorder) {
		t.Helper()
		select {
		case rec := <-c:
			t.Fatalf("answered early: %d %s", rec.Code, rec.Body)
		case <-time.After(100 * time.Millisecond):
		}
	}
	put := func(target string) {
		op.SiteStore().Put(target, []signals.Row{{Name: signals.Ready, Labels: []signals.Label{{Name: signals.LabelProvider, Value: target}, {Name: signals.LabelSite, Value: "hub"}}, Value: 1}}, clk.Now())
	}

	first := answered(read("", "10.0.0.1:1"))
	c0 := first.Header().Get(signals.CursorHeader)
	if first.Code != 200 || c0 == "" {
		t.Fatalf("a plain read: %d, cursor %q", first.Code, c0)
	}
	// Waiting on the current cursor: answered when a row changes.
	waiting := read("?wait=30s&since="+c0, "10.0.0.1:1")
	pending(waiting)
	put("pool-a")
	rec := answered(waiting)
	c1 := rec.Header().Get(signals.CursorHeader)
	if c1 == c0 || !containsRow(rec.Body.String(), "pool-a") {
		t.Errorf("the change's answer: cursor %s after %s, body %s", c1, c0, rec.Body)
	}
	// An older cursor is answered at once.
	answered(read("?wait=30s&since="+c0, "10.0.0.1:1"))
	// No change: answered when the wait ends on the operator's clock.
	waiting = read("?wait=3s&since="+c1, "10.0.0.1:1")
	pending(waiting)
	clk.Advance(2 * time.Second)
	pending(waiting)
	clk.Advance(2 * time.Second)
	if rec := answered(waiting); rec.Header().Get(signals.CursorHeader) != c1 {
		t.Errorf("a timed-out wait changed the cursor: %s", rec.Header().Get(signals.CursorHeader))
	}
	// The same caller waits again: the first wait ends.
	w1 := read("?wait=30s&since="+c1, "10.0.0.1:1")
	pending(w1)
	w2 := read("?wait=30s&since="+c1, "10.0.0.1:1")
	answered(w1)
	pending(w2)
	// Another replica of the gateway (another connection) waits beside it.
	w3 := read("?wait=30s&since="+c1, "10.0.0.2:1")
	pending(w3)
	pending(w2)
	// Stopping ends every wait.
	op.waits.stop()
	answered(w2)
	answered(w3)
	// A bad wait or cursor is a 400.
	if rec := answered(read("?wait=soon&since=1", "10.0.0.1:1")); rec.Code != 400 {
		t.Errorf("a bad wait: %d", rec.Code)
	}
	if _, err := strconv.ParseUint(c1, 10, 64); err != nil {
		t.Errorf("cursor %q", c1)
	}
	// Long polls off (Limits.MaxWait 0): a wait is answered at once and
	// without a cursor, so its caller falls back to plain polls.
	plain := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		r := httptest.NewRequest(http.MethodGet, signals.SignalsPath+"?wait=30s&since="+c1, nil)
		r.RemoteAddr = "10.0.0.3:1"
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{own.Certificates[0]}}
		rec := httptest.NewRecorder()
		op.signalsHandler(0).ServeHTTP(rec, r)
		plain <- rec
	}()
	if rec := answered(plain); rec.Code != 200 || rec.Header().Get(signals.CursorHeader) != "" {
		t.Errorf("with long polls off: %d, cursor %q; want 200 and none", rec.Code, rec.Header().Get(signals.CursorHeader))
	}
}

func containsRow(body, provider string) bool {
	return strings.Contains(body, `grid_provider="`+provider+`"`)
}

// runPeersEvery runs s's peer loops, with peerPollInterval every, until
// the test ends.
func runPeersEvery(t *testing.T, s *site, every time.Duration) {
	cfg := *s.op.cfg.Load()
	cfg.PeerPollInterval = config.Duration(every)
	s.op.cfg.Store(&cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.op.RunPeers(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestPeerUpLaterIsReadSoon: when a grid starts, an operator's first polls
// of a peer not yet up fail; the next come after 250 ms, doubling, not a
// whole peerPollInterval (10 s here) later, so west is read within a
// couple of seconds of starting. Before, each gateway knew only its own
// site for those seconds and sent it every request.
func TestPeerUpLaterIsReadSoon(t *testing.T) {
	dir := pki(t, "east", "west")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	westAddr := ln.Addr().String()
	ln.Close() // west is not up yet
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "west=https://"+westAddr)
	runPeersEvery(t, east, 10*time.Second)
	waitFor(t, 5*time.Second, "east's first poll of west fails", func() bool {
		return testutil.ToFloat64(east.op.m.peers.polls.WithLabelValues("west", OutcomeRefused)) > 0
	})
	west := startSite(t, dir, "west", t.TempDir(), westAddr, nil, "east=https://"+east.addr)
	putReady(west.op, "west", "p")
	took := waitFor(t, 4*time.Second, "east reads west once it is up", func() bool { return east.op.PeerStore().Get("west/p") != nil })
	t.Logf("west read %v after it started (peerPollInterval 10s)", took)
}

// TestPeerLongPollCarriesAChangeAtOnce: between two operators, east's loop
// for west waits at west for a change (its peerPollInterval is 10 s here),
// so a row west publishes is in east's peers store within about a second,
// over the one connection east holds to west.
func TestPeerLongPollCarriesAChangeAtOnce(t *testing.T) {
	dir := pki(t, "east", "west")
	west := startSite(t, dir, "west", t.TempDir(), "", nil, "east=https://127.0.0.1:1")
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "west=https://"+west.addr)
	runPeersEvery(t, east, 10*time.Second)

	put := func(p string) {
		putReady(west.op, "west", p)
	}
	has := func(target string) bool { return east.op.PeerStore().Get(target) != nil }
	put("first")
	waitFor(t, 5*time.Second, "east reads west", func() bool { return has("west/first") })
	// The loop now waits at west: a new row arrives at once, not at the
	// next 10 s poll.
	time.Sleep(300 * time.Millisecond) // the long poll is under way
	start := time.Now()
	put("second")
	took := waitFor(t, 3*time.Second, "west's new row reaches east", func() bool { return has("west/second") })
	t.Logf("a row west published reached east in %v (peerPollInterval 10s)", took)
	if time.Since(start) > 3*time.Second {
		t.Error("the change waited for the poll interval")
	}
	// The polls hold one connection between the two sites: ten more
	// changes, read one by one, open no new connection at west.
	accepted := func() float64 { return testutil.ToFloat64(west.op.m.peers.accepted) }
	before := accepted()
	for i := range 10 {
		p := fmt.Sprintf("more-%d", i)
		put(p)
		waitFor(t, 3*time.Second, "the change reaches east", func() bool { return has("west/" + p) })
	}
	if n := accepted() - before; n != 0 {
		t.Errorf("east opened %v connections to west for ten changes, want none beyond the one it holds", n)
	}
	// East's certificate is renewed: the connection it holds was verified
	// under the old material, so its next poll dials afresh, once.
	if err := identity.Issue(dir, "east", nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if changed, err := east.op.id.Reload(); err != nil || !changed {
		t.Fatalf("reload of the renewed certificate: %v, %v", changed, err)
	}
	before = accepted()
	for i := range 3 {
		p := fmt.Sprintf("renewed-%d", i)
		put(p)
		waitFor(t, 3*time.Second, "the change reaches east", func() bool { return has("west/" + p) })
	}
	if n := accepted() - before; n != 1 {
		t.Errorf("after a renewal east opened %v connections to west, want one: the old one is not reused", n)
	}
}

// fanoutSite is a site of 16 providers, its signals handler, and the TLS
// state of its own gateway reading it.
func fanoutSite(b *testing.B) (*Operator, http.Handler, *tls.ConnectionState) {
	op := newPeeringOperatorOn(b, clock.Real{}, "hub")
	for i := range 16 {
		putReady(op, "hub", fmt.Sprintf("pool-%02d", i))
	}
	own, err := op.id.GetX509SVID()
	if err != nil {
		b.Fatal(err)
	}
	return op, op.SignalsHandler(), &tls.ConnectionState{PeerCertificates: []*x509.Certificate{own.Certificates[0]}}
}

// putReady publishes provider of site as ready in op's site store: a change.
func putReady(op *Operator, site, provider string) {
	op.SiteStore().Put(provider, []signals.Row{{Name: signals.Ready, Labels: []signals.Label{{Name: signals.LabelProvider, Value: provider}, {Name: signals.LabelSite, Value: site}}, Value: 1}}, time.Now())
}

// BenchmarkLongPollFanout measures what waiting callers cost an operator:
// N long polls held (its peers, or its gateway replicas), then one change
// that answers them all. It reports the time and the allocations of one
// change (rendering N answers of a 16-provider site) and the heap each
// waiting request holds.
func BenchmarkLongPollFanout(b *testing.B) {
	for _, n := range []int{3, 10, 30, 100} {
		b.Run(fmt.Sprintf("waiting=%d", n), func(b *testing.B) {
			op, handler, reader := fanoutSite(b)
			var held float64
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				v, _ := op.waits.relay.state()
				var ms0, ms1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms0)
				var wg sync.WaitGroup
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := httptest.NewRequest(http.MethodGet, signals.SignalsPath+"?wait=30s&since="+strconv.FormatUint(v, 10), nil)
						r.RemoteAddr = fmt.Sprintf("10.0.%d.%d:1", i/250, i%250)
						r.TLS = reader
						handler.ServeHTTP(httptest.NewRecorder(), r)
					}()
				}
				for {
					op.waits.mu.Lock()
					waiting := len(op.waits.waiting)
					op.waits.mu.Unlock()
					if waiting == n {
						break
					}
					time.Sleep(time.Millisecond)
				}
				runtime.ReadMemStats(&ms1)
				held += float64(ms1.HeapInuse+ms1.StackInuse) - float64(ms0.HeapInuse+ms0.StackInuse)
				b.StartTimer()
				putReady(op, "hub", "pool-00")
				wg.Wait()
			}
			b.ReportMetric(held/float64(b.N)/float64(n), "held-B/wait")
		})
		// Against plain polling: one round of N callers reading at once,
		// what the same callers cost every peerPollInterval without waits.
		b.Run(fmt.Sprintf("plain=%d", n), func(b *testing.B) {
			_, handler, reader := fanoutSite(b)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				// The callers and their requests exist before the round,
				// as the long polls' do before the change.
				b.StopTimer()
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range n {
					r := httptest.NewRequest(http.MethodGet, signals.SignalsPath, nil)
					r.RemoteAddr = fmt.Sprintf("10.0.%d.%d:1", i/250, i%250)
					r.TLS = reader
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						handler.ServeHTTP(httptest.NewRecorder(), r)
					}()
				}
				b.StartTimer()
				close(start)
				wg.Wait()
			}
		})
	}
}

// TestLongPollsCannotStarveAnotherPeer: at the default caps, a peer that
// spends its eight connections on long polls holds one wait (each wait ends
// its predecessor) and is shed past its eight; another peer and the
// site's own gateway are still answered at once, and the other peer's wait
// is its own: a change answers both peers' waits.
func TestLongPollsCannotStarveAnotherPeer(t *testing.T) {
	dir := pki(t, "east", "west", "south")
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1", "south=https://127.0.0.1:1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// longPoll opens a connection of its own and waits on it.
	longPoll := func(from *identity.Source, since string) (chan int, *http.Client) {
		conf, err := from.ClientTLS("east")
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf, MaxConnsPerHost: 1}}
		t.Cleanup(c.CloseIdleConnections)
		done := make(chan int, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+east.addr+signals.SignalsPath+"?wait=30s&since="+since, nil)
			resp, err := c.Do(req)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done, c
	}
	cursorOf := func(from *identity.Source) string {
		resp, err := client(t, from).Get("https://" + east.addr + signals.SignalsPath)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get(signals.CursorHeader)
	}
	west, south := idSource(t, dir, "west"), idSource(t, dir, "south")
	since := cursorOf(west)
	waitsHeld := func() int {
		east.op.waits.mu.Lock()
		defer east.op.waits.mu.Unlock()
		return len(east.op.waits.waiting)
	}
	// West fills its eight connections: the one that read the cursor, and
	// seven waits, one after another.
	var answered []int
	var last chan int
	for i := range DefaultLimits.PerPeer - 1 {
		done, _ := longPoll(west, since)
		if last != nil {
			select { // the new wait ends the one before it
			case code := <-last:
				answered = append(answered, code)
			case <-time.After(5 * time.Second):
				t.Fatalf("west's wait %d was not ended by the next", i)
			}
		}
		waitFor(t, 5*time.Second, "west's wait held", func() bool { return waitsHeld() == 1 })
		last = done
	}
	if len(answered) != DefaultLimits.PerPeer-2 || slices.ContainsFunc(answered, func(c int) bool { return c != 200 }) {
		t.Errorf("west's superseded waits: %v, want %d answers of 200", answered, DefaultLimits.PerPeer-2)
	}
	// A ninth west connection is shed; south and the east's gateway are not.
	if code, err := fetch(client(t, west), east.addr); err != nil || code != 503 {
		t.Errorf("west's ninth connection: %d %v, want 503", code, err)
	}
	for name, from := range map[string]*identity.Source{"south": south, "east's gateway": idSource(t, dir, "east")} {
		began := time.Now()
		if code, err := fetch(client(t, from), east.addr); err != nil || code != 200 {
			t.Errorf("%s beside west's waits: %d %v", name, code, err)
		}
		if d := time.Since(began); d > 2*time.Second {
			t.Errorf("%s answered after %v beside west's waits", name, d)
		}
	}
	southWait, _ := longPoll(south, cursorOf(south))
	waitFor(t, 5*time.Second, "both peers wait", func() bool { return waitsHeld() == 2 })
	putReady(east.op, "east", "pool-a")
	for name, c := range map[string]chan int{"west": last, "south": southWait} {
		select {
		case code := <-c:
			if code != 200 {
				t.Errorf("%s's wait answered %d", name, code)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s's wait not answered by the change", name)
		}
	}
}
