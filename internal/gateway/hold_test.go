package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/gateway"
	"github.com/grid-inference/grid/internal/sim"
)

// TestHeldWhileFullUntilRoom: with availability.holdWhenFull, a request
// that finds both sites full by the gateway's own count waits at the
// gateway, sent to no site's queue, and is sent as soon as one of the
// gateway's requests ends. Two sites of 4 slots, filled by streams of 3 s
// sent through east's gateway until it holds one.
func TestHeldWhileFullUntilRoom(t *testing.T) {
	g := startGrid(t, gridSpec{slots: map[string]int{"east": 4, "west": 4}, ceilingFloor: 4, hold: "30s"})
	east := g["east"]
	warm(t, east)
	h := east.gw.MetricsHandler()
	sent := func() float64 { return metric(h, "grid_route_decisions_total", `reason="routed"`) }
	held := func() float64 { return metric(h, "grid_gateway_requests_held") }

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	type answer struct {
		code int
		err  error
	}
	answers := make(chan answer, 16)
	started := 0
	stream := func() {
		started++
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+east.client+"/v1/chat/completions", strings.NewReader(chatBody(150, true)))
			resp, err := client.Do(req)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers <- answer{code: resp.StatusCode}
		}()
	}
	// Streams of 150 tokens at 20 ms, sent one at a time, each once the
	// one before was sent somewhere, until one is held: the eighth
	// fills both sites when the gateway spread them four and four, a
	// later one when it sent some to a site's queue before it held eight
	// (the draw by share decides until then).
	for n, isHeld := 1, false; !isHeld; n++ {
		if n == 17 {
			for _, c := range east.gw.View().Sites {
				t.Logf("%s: inflight %v ceiling %v", c.Site, deref(c.InFlight), deref(c.Ceiling))
			}
			logSeries(t, "east", east.gw, "grid_route_decisions", "grid_route_selections", "grid_route_site_trust", "grid_gateway_request_duration_seconds_count")
			for len(answers) > 0 {
				t.Logf("answer %+v", <-answers)
			}
			t.Fatalf("sixteen streams on eight slots and none held")
		}
		before := sent()
		stream()
		waitUntil(t, 5*time.Second, "the stream is sent or held", func() bool {
			isHeld = held() == 1
			return isHeld || sent() > before
		})
	}
	// Held, and sent nowhere while every site is full.
	before := sent()
	time.Sleep(300 * time.Millisecond)
	if n := sent() - before; n != 0 || held() != 1 {
		t.Fatalf("while both sites were full, %v requests were sent and %v held; want 0 and 1", n, held())
	}
	// The first stream to end makes room: the held one is sent, and
	// answered whole.
	waitUntil(t, 10*time.Second, "the held request is sent", func() bool { return held() == 0 })
	if n := metric(h, "grid_gateway_holds_total", `end="room"`); n != 1 {
		t.Errorf("holds ended by room: %v, want 1", n)
	}
	if sent() != before+1 {
		t.Errorf("the held request was sent %v times", sent()-before)
	}
	for range started {
		if a := <-answers; a.err != nil || a.code != http.StatusOK {
			t.Errorf("a stream failed: %+v", a)
		}
	}
}

// TestClientCutEndsItsCount: a stream the client leaves, before its first
// token or after, leaves the gateway's own count of its site (the count
// the own-count pick and the hold read) at once, as its slot leaves the
// engine.
func TestClientCutEndsItsCount(t *testing.T) {
	for _, tc := range []struct {
		name string
		ttft time.Duration
	}{{"before its first token", 10 * time.Second}, {"after its first token", 20 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGrid(t, gridSpec{slots: map[string]int{"east": 1, "west": 1}, ttft: map[string]time.Duration{"east": tc.ttft, "west": tc.ttft}})
			east := g["east"]
			ctx, cut := context.WithCancel(context.Background())
			defer cut()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+east.client+"/v1/chat/completions", strings.NewReader(chatBody(1000, true)))
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			count := func() float64 {
				return gateway.OwnInFlight(east.gw, "east", sim.DefaultModel) + gateway.OwnInFlight(east.gw, "west", sim.DefaultModel)
			}
			waitUntil(t, 10*time.Second, "the stream is counted", func() bool { return count() == 1 })
			if tc.ttft < time.Second {
				time.Sleep(200 * time.Millisecond) // past its first tokens
			}
			cut()
			<-done
			waitUntil(t, 5*time.Second, "the cut stream leaves the count", func() bool { return count() == 0 })
			gone := func() float64 {
				return metric(east.gw.MetricsHandler(), "grid_gateway_request_duration_seconds_count", `outcome="client_gone"`)
			}
			waitUntil(t, 5*time.Second, "the cut stream counted as its client's leaving", func() bool { return gone() == 1 })
		})
	}
}
