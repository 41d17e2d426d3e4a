package gateway

import (
	"fmt"
	"testing"

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
