package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/route"
)

// Measuring the round trip to each peer site's gateway, which the latency
// policy adds to a remote site's time to first token (docs/routing.md).
//
// The hop's HTTP/2 connections are pinged by net/http for liveness, and
// the round trip of those pings is not observable; so the gateway asks
// each peer's hop listener for GET /v1/grid/ping once a probeEvery while
// it is busy, on the connection its requests use, and times the request
// from the moment it has a connection to the first byte of the answer (a
// dial and a TLS handshake are not the path's round trip). Each sample
// moves the site's estimate an eighth of the way (route.RoundTrip).

// probeEvery is how often the gateway measures its peers' round trips, and
// probeTimeout how long one measurement may take before it teaches nothing.
const (
	probeEvery   = time.Second
	probeTimeout = 2 * time.Second
)

// probeLoop measures the round trip to every peer site in the current
// snapshot every probeEvery, until ctx ends; an idle gateway does not
// probe. Run owns it.
func (g *Gateway) probeLoop(ctx context.Context) {
	for clock.Sleep(ctx, g.clk, probeEvery) {
		if g.idle() {
			continue
		}
		snap := g.builder.Current()
		seen := map[string]bool{}
		var wg sync.WaitGroup
		for i := range snap.Candidates {
			c := &snap.Candidates[i]
			if c.Local || c.Upstream == nil || seen[c.Site] {
				continue
			}
			seen[c.Site] = true
			wg.Add(1)
			go func() { defer wg.Done(); g.probe(ctx, c) }()
		}
		wg.Wait()
	}
}

// probe measures one round trip to c's site's gateway; a probe that fails
// or takes longer than probeTimeout teaches nothing (a peer that stopped is
// found by the hop's liveness check and passive health).
func (g *Gateway) probe(ctx context.Context, c *route.Candidate) {
	t, err := g.upstreams.transport(c)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var conn, first time.Time
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:              func(httptrace.GotConnInfo) { conn = time.Now() },
		GotFirstResponseByte: func() { first = time.Now() },
	})
	u := *c.Upstream
	u.Path, u.RawQuery = hopPingPath, ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode == http.StatusNoContent && !conn.IsZero() && first.After(conn) {
		g.service.RoundTrip(c.Site).Observe(float64(first.Sub(conn)) / float64(time.Millisecond))
	}
}
