package gateway_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/gateway"
)

// skewedClock is the wall clock shifted by an offset the test moves: a host
// whose clock is wrong, or is stepped, while it runs.
type skewedClock struct{ offset atomic.Int64 }

func (c *skewedClock) Now() time.Time                         { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *skewedClock) NewTimer(d time.Duration) clock.Timer   { return clock.Real{}.NewTimer(d) }
func (c *skewedClock) NewTicker(d time.Duration) clock.Ticker { return clock.Real{}.NewTicker(d) }
func (c *skewedClock) Monotonic() time.Duration               { return clock.Real{}.Monotonic() }

// metric sums the samples of family whose labels hold every one of labels,
// from a /metrics handler.
func metric(h http.Handler, family string, labels ...string) float64 {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sum := 0.0
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if !strings.HasPrefix(line, family+"{") && !strings.HasPrefix(line, family+" ") {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line, l)
		}
		if all {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			sum += v
		}
	}
	return sum
}

// measured reports whether the view draws on site: admitted and measured.
func measured(v gateway.SnapshotView, site string) bool {
	for _, c := range v.Sites {
		if c.Site == site && c.Ready && c.InFlight != nil {
			return true
		}
	}
	return false
}

// TestPeerClockFaults: west's operator runs on a clock 2 minutes ahead,
// then stepped back 2 minutes mid-run, then 2 days behind. Every row is
// stamped and dated from that one clock, so east reads west's load by its
// age, never by west's wall time: west stays measured and served, and nothing
// is refused once the step has passed. (In-process: a real process's wall
// clock cannot be moved from outside; TLS still checks certificates against
// the host's real clock, see docs/reliability.md.)
func TestPeerClockFaults(t *testing.T) {
	westClock := &skewedClock{}
	g := startGrid(t, gridSpec{slots: map[string]int{"east": 4, "west": 4}, clocks: map[string]clock.Clock{"west": westClock}})
	east := g["east"]
	warm(t, east)
	for _, phase := range []struct {
		name   string
		offset time.Duration
	}{
		{"on time (baseline)", 0},
		{"2 minutes ahead", 2 * time.Minute},
		{"stepped back 2 minutes mid-run", 0},
		{"2 days behind", -48 * time.Hour},
	} {
		t.Run(phase.name, func(t *testing.T) {
			westClock.offset.Store(int64(phase.offset))
			// Two of east's polls of west on the new clock, and a poll of
			// east's gateway after them.
			polls := func() float64 {
				return metric(east.op.Handler(), "grid_peer_poll_total", `peer="west"`, `outcome="ok"`)
			}
			gwPolls := func() float64 { return metric(east.gw.MetricsHandler(), "grid_signals_poll_total", `result="ok"`) }
			from := polls()
			waitUntil(t, 15*time.Second, "two polls of west", func() bool { return polls() >= from+2 })
			from = gwPolls()
			waitUntil(t, 10*time.Second, "a poll of east's gateway", func() bool { return gwPolls() >= from+1 })
			skewBefore := metric(east.gw.MetricsHandler(), "grid_signals_ingest_dropped_total", `reason="skew"`)
			refusedBefore := metric(east.op.Handler(), "grid_peer_signals_refused_total", `peer="west"`)
			deadline := time.Now().Add(10 * time.Second)
			for !measured(east.gw.View(), "west") {
				if time.Now().After(deadline) {
					t.Fatalf("east does not draw on west with west's clock %s", phase.name)
				}
				time.Sleep(100 * time.Millisecond)
			}
			servedWest := 0
			for range 40 {
				resp, _ := chat(t, east.client, 1, false)
				if resp.StatusCode != 200 {
					t.Fatalf("request: %d", resp.StatusCode)
				}
				if resp.Header.Get("X-Grid-Site") == "west" {
					servedWest++
				}
			}
			from = gwPolls() // two more polls of east's gateway
			waitUntil(t, 10*time.Second, "two more gateway polls", func() bool { return gwPolls() >= from+2 })
			skew := metric(east.gw.MetricsHandler(), "grid_signals_ingest_dropped_total", `reason="skew"`) - skewBefore
			refused := metric(east.op.Handler(), "grid_peer_signals_refused_total", `peer="west"`) - refusedBefore
			t.Logf("west %s: %d of 40 requests served by west; rows refused after the step: %v at east's operator, %v skew drops at east's gateway", phase.name, servedWest, refused, skew)
			// How the requests split depends on what each site's last reading
			// caught in flight; the clock must only not take west out.
			if servedWest == 0 || skew != 0 || refused != 0 {
				t.Errorf("west's clock %s disturbed routing: %d served by west, %v refused, %v skew drops", phase.name, servedWest, refused, skew)
			}
		})
	}
}
