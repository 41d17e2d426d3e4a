package gateway

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/sim"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSnapshotJSONAndUI(t *testing.T) {
	g := gatewayWithEastPool(t)
	defer g.Close()
	g.picks.add("east")

	rec := httptest.NewRecorder()
	g.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/api/snapshot", nil))
	var v SnapshotView
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("%v: %s", err, rec.Body.String())
	}
	if v.Site != "east" || len(v.Sites) != 1 || v.Picks["east"] != 1 {
		t.Fatalf("view %+v", v)
	}
	c := v.Sites[0]
	if c.Model != sim.DefaultModel || !c.Ready || !c.Local || c.InFlight == nil || *c.InFlight != 12 || c.Ceiling == nil || c.Rho == nil {
		t.Errorf("candidate %+v", c)
	}
	// Unmeasured values are null, never NaN (which JSON cannot carry).
	if strings.Contains(rec.Body.String(), "NaN") {
		t.Errorf("NaN in JSON: %s", rec.Body.String())
	}

	rec = httptest.NewRecorder()
	g.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/ui", nil))
	page := rec.Body.String()
	if rec.Code != 200 || !strings.Contains(page, "api/snapshot") || strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Errorf("/ui: %d, self-contained %v", rec.Code, !strings.Contains(page, "http"))
	}
}

// gatewayWithEastPool is a gateway whose snapshot holds one ready local
// site, east, running 12 requests on 2 endpoints.
func gatewayWithEastPool(t *testing.T) *Gateway {
	t.Helper()
	return gatewayWithEastPoolAt(t, "http://127.0.0.1:9")
}

// gatewayWithEastPoolAt is gatewayWithEastPool forwarding to upstream.
func gatewayWithEastPoolAt(t *testing.T, upstream string) *Gateway {
	t.Helper()
	g := benchGateway(t, upstream)
	const now = 1_000_000
	g.store.Ingest([]byte(strings.Join([]string{
		`llm_d_epp_average_running_requests{grid_provider="pool",grid_site="east",name="pool"} 6 1000000`,
		`llm_d_epp_average_queue_size{grid_provider="pool",grid_site="east",name="pool"} 0 1000000`,
		`llm_d_epp_ready_endpoints{grid_provider="pool",grid_site="east",name="pool"} 2 1000000`,
	}, "\n")+"\n"), now, g.timeline.NowMs(), now, signals.Origin{Site: "east", Relay: true})
	g.refresh()
	return g
}

// TestSheddingSeriesFromTheStart: a model the gateway routes has its
// grid_route_shedding series at 0 from the first snapshot on, so a
// dashboard panel shows "not shedding" instead of nothing; the gateway
// exports its identity's expiry as the operator does.
func TestSheddingSeriesFromTheStart(t *testing.T) {
	g := gatewayWithEastPool(t)
	defer g.Close()
	if got := testutil.ToFloat64(g.m.shedding.WithLabelValues(sim.DefaultModel)); got != 0 {
		t.Errorf("grid_route_shedding{model=%q} = %v before any shed, want 0", sim.DefaultModel, got)
	}
	if n := testutil.CollectAndCount(g.m.shedding); n != 1 {
		t.Errorf("%d shedding series, want one per routed model", n)
	}
	mfs, err := g.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "grid_site_identity_expiry_timestamp_seconds" {
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v < float64(time.Now().Unix()) {
				t.Errorf("identity expiry %v is in the past", v)
			}
			return
		}
	}
	t.Error("the gateway does not export grid_site_identity_expiry_timestamp_seconds")
}

// TestHistoryEncodedOncePerPoint: the dashboard's history answer is
// encoded once per change, however many clients read it (50 clients
// polling it cost the gateway 3.1 s of CPU in 15 s when every read
// encoded), and a new point or note is in the next answer.
func TestHistoryEncodedOncePerPoint(t *testing.T) {
	h := newHistory()
	at := time.Unix(1_800_000_000, 0)
	h.record(SnapshotView{Sites: []CandidateView{{Site: "east"}}}, at)
	first := h.answer("east")
	for range 50 {
		if got := h.answer("east"); !bytes.Equal(got, first) {
			t.Fatal("an unchanged history answered differently")
		}
	}
	if n := h.encodes.Load(); n != 1 {
		t.Fatalf("51 reads of one version encoded %d times, want 1", n)
	}
	h.record(SnapshotView{Sites: []CandidateView{{Site: "east"}}}, at.Add(historyStep))
	h.note("a note", at.Add(historyStep))
	var v HistoryView
	if err := json.Unmarshal(h.answer("east"), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Points) != 2 || len(v.Notes) != 1 {
		t.Errorf("after a point and a note: %d points, %d notes, want 2 and 1", len(v.Points), len(v.Notes))
	}
	if n := h.encodes.Load(); n != 2 {
		t.Errorf("encoded %d times, want 2", n)
	}
}
