package gateway

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grid-inference/grid/internal/route"
)

// TestDistrustIsPublishedAndWarned: each remote site's trust is a gauge per
// model; the refresh at which a site falls to half its claims or less
// warns once, the one at which it climbs back says so, and a site that
// leaves the topology loses its series. This site's providers are not
// judged, and have none.
func TestDistrustIsPublishedAndWarned(t *testing.T) {
	g, _ := newTestGateway(t, "https://127.0.0.1:1")
	defer g.Close()
	var logs bytes.Buffer
	g.log = slog.New(slog.NewTextHandler(&logs, nil))
	snap := &route.Snapshot{Candidates: []route.Candidate{
		{Site: "east", Model: "m", Provider: "east-pool", Local: true},
		{Site: "west", Model: "m", Provider: "west-a"},
		{Site: "west", Model: "m", Provider: "west-b"},
		{Site: "north", Model: "m", Provider: "north-pool"},
	}}
	trust := map[string]float64{"west": 1, "north": 1}
	refresh := func() string {
		t.Helper()
		logs.Reset()
		g.noteTrust(snap, func(site, model string) float64 {
			if model != "m" {
				t.Fatalf("trust asked of model %q", model)
			}
			return trust[site]
		})
		return logs.String()
	}
	gauge := func(site string) float64 { return testutil.ToFloat64(g.m.trust.WithLabelValues(site, "m")) }

	if out := refresh(); out != "" {
		t.Errorf("trusted sites logged: %s", out)
	}
	if got := gauge("west"); got != 1 {
		t.Errorf("west's trust gauge %g, want 1", got)
	}
	trust["north"] = 0.3
	out := refresh()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "site=north") || strings.Contains(out, "site=west") {
		t.Errorf("north read at 0.3 of its claims; logged:\n%s", out)
	}
	if got := gauge("north"); got != 0.3 {
		t.Errorf("north's trust gauge %g, want 0.3", got)
	}
	trust["north"] = 0.2
	if out := refresh(); out != "" {
		t.Errorf("north still distrusted warned again:\n%s", out)
	}
	trust["north"] = 0.9
	if out := refresh(); !strings.Contains(out, "level=INFO") || !strings.Contains(out, "site=north") {
		t.Errorf("north trusted again; logged:\n%s", out)
	}
	snap.Candidates = snap.Candidates[:3] // north leaves
	refresh()
	if n := testutil.CollectAndCount(g.m.trust); n != 1 {
		t.Errorf("%d trust series after north left, want west's alone", n)
	}
}
