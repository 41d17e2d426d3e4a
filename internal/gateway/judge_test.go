package gateway_test

import (
	"bufio"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStreamIsJudgedAtItsFirstByte: west's board claims eight idle slots
// while one serves, so streams east's gateway sends it wait there behind
// one another. A stream's wait is over at its first byte, and the board's
// claims of room read while it waited are judged then: east reads west
// below its claims while that stream still decodes. Judged at its end, it
// falls only once the decode is over (2.2 s after the first byte here, 0.2
// s judged at it), and the readings taken during a long decode, a minute
// at 1 s polls, push those of the wait out of the 16 claims kept: a lying
// site kept its trust that way (docs/routing.md, earned capacity).
func TestStreamIsJudgedAtItsFirstByte(t *testing.T) {
	sites := startGrid(t, gridSpec{
		slots:        map[string]int{"east": 1, "west": 1},
		claimsIdle:   map[string]int{"west": 8},
		pollInterval: "200ms", peerPollInterval: "200ms",
	})
	east := sites["east"]
	// east's trust in west (grid_route_site_trust), 0 before it publishes
	// one: trust is never below its floor.
	trust := func() float64 { return metric(east.gw.MetricsHandler(), "grid_route_site_trust", `site="west"`) }
	// An unqueued stream from west first: it teaches east's gateway
	// west's least time to first token, which a wait is measured from.
	waitUntil(t, 20*time.Second, "west serves a lone stream", func() bool {
		resp, _ := chat(t, east.client, 1, true)
		return resp.StatusCode == http.StatusOK && resp.Header.Get("X-Grid-Site") == "west"
	})
	waitUntil(t, 5*time.Second, "east publishes its trust in west", func() bool { return trust() > 0 })
	if tr := trust(); tr != 1 {
		t.Fatalf("before any stream waited, east read west at %.2f", tr)
	}

	// Six streams of 100 tokens (two seconds of decode each) at once:
	// those sent to west wait there behind each other.
	type stream struct {
		site               string
		sent, first, ended time.Time
	}
	streams := make([]stream, 6)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			s := &streams[i]
			s.sent = time.Now()
			resp, err := client.Post("http://"+east.client+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(100, true)))
			if err != nil {
				return
			}
			defer resp.Body.Close()
			s.site = resp.Header.Get("X-Grid-Site")
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if s.first.IsZero() && strings.HasPrefix(sc.Text(), "data: ") {
					s.first = time.Now()
				}
			}
			s.ended = time.Now()
		})
	}
	// The trust gauge is read until the streams end.
	var fell time.Time
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for fell.IsZero() {
		select {
		case <-done:
			fell = time.Now().Add(time.Hour) // not before the streams ended
			continue
		case <-tick.C:
		}
		if tr := trust(); tr > 0 && tr < 1 {
			fell = time.Now()
		}
	}
	<-done

	// The first stream of west's to end after a wait of a second or more:
	// judged at its end, east's trust in west falls after it.
	var waited *stream
	for i := range streams {
		s := &streams[i]
		if s.site == "west" && !s.first.IsZero() && s.first.Sub(s.sent) >= time.Second && (waited == nil || s.ended.Before(waited.ended)) {
			waited = s
		}
	}
	if waited == nil {
		t.Fatalf("no stream waited a second at west: %+v", streams)
	}
	t.Logf("a stream waited %v at west and decoded %v; east read west below its claims %v after its first byte (trust now %.2f)",
		waited.first.Sub(waited.sent).Round(time.Millisecond), waited.ended.Sub(waited.first).Round(time.Millisecond),
		fell.Sub(waited.first).Round(time.Millisecond), trust())
	if !fell.Before(waited.ended) {
		t.Errorf("east's trust in west did not fall before the waited stream ended (first byte after %v, decode %v)",
			waited.first.Sub(waited.sent).Round(time.Millisecond), waited.ended.Sub(waited.first).Round(time.Millisecond))
	}
}
