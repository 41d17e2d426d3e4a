package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/sim"
)

// TestTopologyTakesUpstreamsFromLocalConfig: remote candidates come from
// relayed info rows, but where their requests go comes only from the local
// operator's configuration; a site without a configured gateway has no
// route, whatever its rows say.
func TestTopologyTakesUpstreamsFromLocalConfig(t *testing.T) {
	g := benchGateway(t, "http://127.0.0.1:9")
	g.serving.Store(&signals.Serving{
		Site:      "east",
		Providers: []signals.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: "http://127.0.0.1:9"}},
		Peers:     []signals.ServingPeer{{Site: "west", Gateway: "https://127.0.0.1:8181"}, {Site: "north"}},
	})
	const now = 1_000_000
	var body string
	for _, site := range []string{"west", "north"} {
		// A row may carry any label; none of them is an address.
		body += fmt.Sprintf("grid_provider_info{grid_provider=\"p\",grid_site=%q,model=%q,upstream=\"http://evil\"} 1 %d\n", site, sim.DefaultModel, now)
	}
	g.store.Ingest([]byte(body), now, now, now, signals.Origin{Site: "east", Relay: true})
	cands := g.topology()
	byKey := map[string]route.Candidate{}
	for _, c := range cands {
		byKey[c.Site+"/"+c.Provider] = c
	}
	if c := byKey["east/pool"]; !c.Local || c.Upstream.String() != "http://127.0.0.1:9" {
		t.Errorf("local candidate %+v", c)
	}
	if c := byKey["west/p"]; c.Local || c.Upstream == nil || c.Upstream.String() != "https://127.0.0.1:8181" {
		t.Errorf("west candidate %+v", c)
	}
	if c, ok := byKey["north/p"]; !ok || c.Upstream != nil {
		t.Errorf("north candidate %+v: a site without a configured gateway must have no route", c)
	}
}

// TestHopRoutesLocallyOnly: a request a peer forwarded is routed among this
// site's own providers only, never forwarded again, so two gateways cannot
// bounce a request between them.
func TestHopRoutesLocallyOnly(t *testing.T) {
	g := benchGateway(t, "http://127.0.0.1:9")
	defer g.Close()
	g.serving.Store(&signals.Serving{
		Site:      "east",
		Providers: []signals.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: "http://127.0.0.1:9"}},
		Peers:     []signals.ServingPeer{{Site: "west", Gateway: "https://127.0.0.1:8181"}},
	})
	const now = 1_000_000
	g.store.Ingest([]byte(fmt.Sprintf("grid_provider_info{grid_provider=\"p\",grid_site=\"west\",model=%q} 1 %d\n", sim.DefaultModel, now)), now, now, now, signals.Origin{Site: "east", Relay: true})
	g.refresh()
	sites := func(s *route.Snapshot) map[string]bool {
		out := map[string]bool{}
		for _, c := range s.Candidates {
			out[c.Site] = true
		}
		return out
	}
	if got := sites(g.view(nil)); !got["west"] || !got["east"] {
		t.Fatalf("client view %v, want east and west", got)
	}
	if got := sites(g.view(&signals.ServingPeer{})); got["west"] || !got["east"] {
		t.Errorf("hop view %v, want east only", got)
	}
}

// TestRemovedRemoteProviderIsForgotten: a remote provider whose rows stop
// arriving stays an unmeasured candidate for forgetAfter, then leaves the
// candidate list; providers still relayed stay.
func TestRemovedRemoteProviderIsForgotten(t *testing.T) {
	g := benchGateway(t, "http://127.0.0.1:9")
	defer g.Close()
	clk := clock.NewFake(time.UnixMilli(1_000_000))
	g.timeline = loadstore.NewTimeline(clk)
	g.serving.Store(&signals.Serving{
		Site:         "east",
		Providers:    []signals.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: "http://127.0.0.1:9"}},
		Peers:        []signals.ServingPeer{{Site: "west", Gateway: "https://127.0.0.1:8181"}},
		LoadWindowMs: 13_000,
	})
	info := func(provider string) []byte {
		now := g.timeline.NowMs()
		return []byte(fmt.Sprintf("grid_provider_info{grid_provider=%q,grid_site=\"west\",model=%q} 1 %d\n", provider, sim.DefaultModel, now))
	}
	remote := func() map[string]bool {
		g.forget(g.cfg.Load())
		g.refresh()
		out := map[string]bool{}
		for _, c := range g.Snapshot().Candidates {
			if c.Site == "west" {
				out[c.Provider] = true
			}
		}
		return out
	}
	now := g.timeline.NowMs()
	g.store.Ingest(append(info("kept"), info("removed")...), now, now, now, signals.Origin{Site: "east", Relay: true})
	if got := remote(); !got["kept"] || !got["removed"] {
		t.Fatalf("remote candidates %v", got)
	}
	// Four minutes on, only "kept" is still relayed: both stay.
	clk.Advance(4 * time.Minute)
	now = g.timeline.NowMs()
	g.store.Ingest(info("kept"), now, now, now, signals.Origin{Site: "east", Relay: true})
	if got := remote(); !got["kept"] || !got["removed"] {
		t.Fatalf("within forgetAfter: %v", got)
	}
	// Past five minutes without a row, "removed" is forgotten.
	clk.Advance(90 * time.Second)
	now = g.timeline.NowMs()
	g.store.Ingest(info("kept"), now, now, now, signals.Origin{Site: "east", Relay: true})
	if got := remote(); !got["kept"] || got["removed"] {
		t.Errorf("after forgetAfter: %v, want kept only", got)
	}
}

// TestPollReadsEveryRelayPage: when the operator's body cap cuts its relay,
// one poll cycle follows the cursor and ingests every page; a page that
// fails ends the cycle as a failed poll, keeping the pages read.
func TestPollReadsEveryRelayPage(t *testing.T) {
	var failSecond atomic.Bool
	var afters []string
	var mu sync.Mutex
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g, id := newTestGateway(t, "https://"+ln.Addr().String())
	defer g.Close()
	now := time.Now()
	info := func(provider string) string {
		return fmt.Sprintf("grid_provider_info{grid_provider=%q,grid_site=\"west\",model=%q} 1 %d\n", provider, sim.DefaultModel, now.UnixMilli())
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", now.UTC().Format(http.TimeFormat))
		if r.URL.Path == signals.ServingPath {
			json.NewEncoder(w).Encode(signals.Serving{Site: "east", Peers: []signals.ServingPeer{{Site: "west", Gateway: "https://127.0.0.1:8181"}}, LoadWindowMs: 13_000})
			return
		}
		if r.URL.Path != signals.SignalsPath {
			http.NotFound(w, r) // the rejection reports: not this test's concern
			return
		}
		after := r.URL.Query().Get("after")
		mu.Lock()
		afters = append(afters, after)
		mu.Unlock()
		switch after {
		case "":
			w.Header().Set(signals.RelayNextHeader, "peers:west/a")
			io.WriteString(w, info("a"))
		case "peers:west/a":
			if failSecond.Load() {
				http.Error(w, "boom", http.StatusInternalServerError)
				return
			}
			io.WriteString(w, info("b"))
		default:
			http.Error(w, "bad cursor", http.StatusBadRequest)
		}
	}), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, id.ServerTLS()))
	defer srv.Close()

	g.Poll(context.Background())
	if got := g.store.Keys(); len(got) != 2 {
		t.Fatalf("store holds %v after one poll, want west/a and west/b", got)
	}
	if v := testutil.ToFloat64(g.m.polls.WithLabelValues("ok")); v != 1 {
		t.Errorf("ok polls %v", v)
	}
	if len(afters) != 2 || afters[1] != "peers:west/a" {
		t.Errorf("cursors sent %q", afters)
	}
	// This operator does not answer long polls (its answers carry no
	// cursor): the gateway keeps reading it plainly, every pollInterval.
	if c := g.cursor.Load(); c != nil {
		t.Errorf("long-polling an operator that gave no cursor (%q)", *c)
	}

	// The first poll folded a clean observation (the report channel 404s
	// here, so it stays pending); a partial read folds none.
	g.rep.mu.Lock()
	seqBefore := g.rep.seq
	g.rep.mu.Unlock()
	failSecond.Store(true)
	g.Poll(context.Background())
	if v := testutil.ToFloat64(g.m.polls.WithLabelValues("unreachable")); v != 1 {
		t.Errorf("a failed page counted %v unreachable polls", v)
	}
	if got := g.store.Keys(); len(got) != 2 {
		t.Errorf("store holds %v after a partial read", got)
	}
	g.rep.mu.Lock()
	seqAfter := g.rep.seq
	g.rep.mu.Unlock()
	if seqAfter != seqBefore {
		t.Errorf("a poll whose second page failed folded an observation (sequence %d → %d)", seqBefore, seqAfter)
	}
}

// TestOperatorOfAnotherSiteIsUnauthorized: an operator address that answers
// with another site's certificate (a wrong address, or an impostor) is an
// identity failure, counted as unauthorized rather than unreachable, and
// the gateway stays not ready, saying why.
func TestOperatorOfAnotherSiteIsUnauthorized(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// West's certificate from the grid's own CA: it chains, so only the
	// SPIFFE id check (the site dialled is east) refuses it.
	dir := t.TempDir()
	g, _ := newTestGatewayIn(t, dir, "https://"+ln.Addr().String())
	defer g.Close()
	identity.Issue(dir, "west", nil, time.Now())
	west, err := identity.LoadSource(config.TLS{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "west.crt"), Key: filepath.Join(dir, "west.key")},
		"grid.internal", "west", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, west.ServerTLS()))
	defer srv.Close()
	g.Poll(context.Background())
	if got := testutil.ToFloat64(g.m.polls.WithLabelValues("unauthorized")); got != 1 {
		t.Errorf("unauthorized polls %v (unreachable %v)", got, testutil.ToFloat64(g.m.polls.WithLabelValues("unreachable")))
	}
	if ready, why := g.Ready(); ready || !strings.Contains(why, "not been read") {
		t.Errorf("ready %v: %s", ready, why)
	}
}

// TestHopRequestsAreThePeersToCount: the requests this gateway holds at
// its own site, which its own count routes by, are those it routed, not
// those a peer gateway routed here over the hop. Counted as its own, a
// site's peers' requests made it read its site fuller than the others
// and send nearly all its requests away (6% served at home, against a
// third for nginx, on real processes).
func TestHopRequestsAreThePeersToCount(t *testing.T) {
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer upstream.Close()
	g := benchGateway(t, upstream.URL)
	defer g.Close()
	api := g.apiMux()
	// A request marked so stands for one the hop listener admitted from
	// west (hopHandler): the API handlers read the peer from its context.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Hop") != "" {
			r = r.WithContext(context.WithValue(r.Context(), hopPeerKey{}, &hopRequest{peer: signals.ServingPeer{Site: "west"}}))
		}
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()
	var wg sync.WaitGroup
	for _, hop := range []bool{false, true} {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"`+sim.DefaultModel+`","max_tokens":1}`))
			if hop {
				req.Header.Set("X-Test-Hop", "1")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	<-arrived
	<-arrived
	held := g.service.Served("east", sim.DefaultModel)
	if n := held.InFlight(); n != 1 {
		t.Errorf("holding a client's request and a peer's at its site, the gateway counts %v as its own, want 1", n)
	}
	close(release)
	wg.Wait()
	waitFor(t, "the client's request to end in the count", func() bool { return held.InFlight() == 0 })
}
