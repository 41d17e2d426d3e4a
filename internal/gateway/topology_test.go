package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/operator"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/sim"
)

// TestTopologyTakesUpstreamsFromLocalConfig: remote candidates come from
// relayed info rows, but where their requests go comes only from the local
// operator's configuration; a site without a configured gateway has no
// route, whatever its rows say.
func TestTopologyTakesUpstreamsFromLocalConfig(t *testing.T) {
	g := benchGateway(t, "http://127.0.0.1:9")
	g.serving.Store(&operator.Serving{
		Site:      "east",
		Providers: []operator.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: "http://127.0.0.1:9"}},
		Peers:     []operator.ServingPeer{{Site: "west", Gateway: "https://127.0.0.1:8181"}, {Site: "north"}},
	})
	const now = 1_000_000
	var body string
	for _, site := range []string{"west", "north"} {
		// A row may carry any label; none of them is an address.
		body += fmt.Sprintf("grid_provider_info{grid_provider=\"p\",grid_site=%q,model=%q,upstream=\"http://evil\"} 1 %d\n", site, sim.DefaultModel, now)
	}
	g.store.Ingest([]byte(body), now, now, now, "east", true)
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
	g.serving.Store(&operator.Serving{
		Site:      "east",
		Providers: []operator.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: "http://127.0.0.1:9"}},
		Peers:     []operator.ServingPeer{{Site: "west", Gateway: "https://127.0.0.1:8181"}},
	})
	const now = 1_000_000
	g.store.Ingest([]byte(fmt.Sprintf("grid_provider_info{grid_provider=\"p\",grid_site=\"west\",model=%q} 1 %d\n", sim.DefaultModel, now)), now, now, now, "east", true)
	g.refresh()
	sites := func(s *route.Snapshot) map[string]bool {
		out := map[string]bool{}
		for _, c := range s.Candidates {
			out[c.Site] = true
		}
		return out
	}
	if got := sites(g.snapshot(false)); !got["west"] || !got["east"] {
		t.Fatalf("client view %v, want east and west", got)
	}
	if got := sites(g.snapshot(true)); got["west"] || !got["east"] {
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
	g.serving.Store(&operator.Serving{
		Site:         "east",
		Providers:    []operator.ServingProvider{{Name: "pool", Model: sim.DefaultModel, Upstream: "http://127.0.0.1:9"}},
		Peers:        []operator.ServingPeer{{Site: "west", Gateway: "https://127.0.0.1:8181"}},
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
	g.store.Ingest(append(info("kept"), info("removed")...), now, now, now, "east", true)
	if got := remote(); !got["kept"] || !got["removed"] {
		t.Fatalf("remote candidates %v", got)
	}
	// Four minutes on, only "kept" is still relayed: both stay.
	clk.Advance(4 * time.Minute)
	now = g.timeline.NowMs()
	g.store.Ingest(info("kept"), now, now, now, "east", true)
	if got := remote(); !got["kept"] || !got["removed"] {
		t.Fatalf("within forgetAfter: %v", got)
	}
	// Past five minutes without a row, "removed" is forgotten.
	clk.Advance(90 * time.Second)
	now = g.timeline.NowMs()
	g.store.Ingest(info("kept"), now, now, now, "east", true)
	if got := remote(); !got["kept"] || got["removed"] {
		t.Errorf("after forgetAfter: %v, want kept only", got)
	}
}
