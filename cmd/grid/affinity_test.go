package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// turn sends one turn of a conversation to the gateway at addr, with the
// session key in X-Session-Id ("" for none), and returns the site that
// served it ("" on a failure).
func turn(t *testing.T, addr, session string, n int) string {
	t.Helper()
	body := fmt.Sprintf(`{"model":"Qwen/Qwen3-8B","max_tokens":2,"messages":[{"role":"user","content":"turn %d"}]}`, n)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Logf("turn %d of %s: %v", n, session, err)
		return ""
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Logf("turn %d of %s: %d", n, session, resp.StatusCode)
		return ""
	}
	return resp.Header.Get("X-Grid-Site")
}

// reloadOperator rewrites site's operator configuration with its provider
// entry extended by extra (YAML flow keys, e.g. ", admission: existing_only")
// and sends SIGHUP.
func (g *faultGrid) reloadOperator(site, extra string) {
	g.t.Helper()
	g.providerExtra[site] = extra
	g.writeConfigs(g.sites[site])
	g.sites[site].op.cmd.Process.Signal(syscall.SIGHUP)
}

// logRouting logs what both gateways say of their routing, for a failure.
func (g *faultGrid) logRouting(t *testing.T) {
	for _, site := range []string{"east", "west"} {
		for _, l := range strings.Split(g.metricsOf(site, "gw"), "\n") {
			if strings.HasPrefix(l, "grid_route_") || strings.HasPrefix(l, "grid_gateway_upstream") {
				t.Log(site, l)
			}
		}
		t.Log(httpGet("http://" + g.sites[site].gwMetrics + "/api/snapshot"))
	}
}

// TestSessionAffinity runs a two-site grid of real processes whose gateways
// bind sessions by X-Session-Id: a session stays on one site for 20 turns;
// it moves, counted as a failover, when that site is marked unavailable and
// when it is saturated; a site draining with admission existing_only keeps
// its bound sessions and takes no new one.
func TestSessionAffinity(t *testing.T) {
	g := startFaultGridWith(t, faultTimings, "affinity: {header: X-Session-Id}")
	entry := g.sites["east"].client
	affinity := func(outcome string) float64 {
		return sample(g.metricsOf("east", "gw"), "grid_route_affinity_total", `outcome="`+outcome+`"`)
	}
	// A gateway reads its own sends in the unit of its requests' duration,
	// which it learns from them (10 s before the first): give it some
	// history and a rebuild, as any gateway in service has.
	for n := range 40 {
		turn(t, entry, "", n)
	}
	time.Sleep(2 * time.Second)

	t.Run("sticks for 20 turns", func(t *testing.T) {
		g.t = t
		home := turn(t, entry, "chat-1", 0)
		for n := 1; n < 20; n++ {
			if got := turn(t, entry, "chat-1", n); got != home {
				g.logRouting(t)
				t.Fatalf("turn %d went to %q; the session is bound to %q", n, got, home)
			}
		}
		if reused := affinity("reused"); reused < 19 {
			t.Errorf("grid_route_affinity_total{outcome=reused} = %v after 19 bound turns", reused)
		}
	})

	t.Run("every session on one site for all its turns", func(t *testing.T) {
		g.t = t
		// 12 sessions of 10 sequential turns at once: some first turns go
		// to the peer site, and those sessions must stay there too (two
		// of twelve once served their first turn west and the other nine
		// east).
		sites := make([][]string, 12)
		var wg sync.WaitGroup
		for k := range sites {
			wg.Go(func() {
				for n := range 10 {
					sites[k] = append(sites[k], turn(t, entry, fmt.Sprintf("many-%d", k), n))
				}
			})
		}
		wg.Wait()
		firstWest := 0
		for k, s := range sites {
			if s[0] == "west" {
				firstWest++
			}
			for n, site := range s {
				if site != s[0] {
					g.logRouting(t)
					t.Fatalf("session %d: turn %d went to %q, its first to %q (%v)", k, n, site, s[0], s)
				}
			}
		}
		t.Logf("12 sessions × 10 turns, each on one site; %d began west", firstWest)
	})

	t.Run("moves when its site is unavailable", func(t *testing.T) {
		g.t = t
		home := turn(t, entry, "chat-2", 0)
		other := map[string]string{"east": "west", "west": "east"}[home]
		before := affinity("failover")
		g.reloadOperator(home, ", unavailable: true")
		g.waitReady("east", home, false, 15*time.Second)
		if got := turn(t, entry, "chat-2", 1); got != other {
			t.Fatalf("with %s unavailable the session went to %q, want %s", home, got, other)
		}
		// The gateway counts a failover when it binds the session anew,
		// as the answer's headers arrive; the metrics are read through a
		// listener of their own, so wait for the count.
		eventually(t, "the failover is counted", 5*time.Second, func() bool { return affinity("failover") >= before+1 })
		if got := affinity("failover"); got != before+1 {
			t.Errorf("failovers %v → %v, want one more", before, got)
		}
		// Rebound: it stays on its new site after its old one is back.
		g.reloadOperator(home, "")
		g.waitReady("east", home, true, 15*time.Second)
		for n := 2; n < 6; n++ {
			if got := turn(t, entry, "chat-2", n); got != other {
				t.Fatalf("turn %d after the failover went to %q, want %s (its new binding)", n, got, other)
			}
		}
	})

	t.Run("moves when its site is saturated", func(t *testing.T) {
		g.t = t
		home := turn(t, entry, "chat-3", 0)
		other := map[string]string{"east": "west", "west": "east"}[home]
		before := affinity("failover")
		// 24 long completions straight to home's engines (16 slots): a
		// backlog its operator scrapes and east's gateway reads.
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.sites[home].simAddr+"/v1/chat/completions",
					strings.NewReader(`{"model":"Qwen/Qwen3-8B","max_tokens":4000,"messages":[{"role":"user","content":"long"}]}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		defer func() {
			cancel()
			wg.Wait()
			// The next case starts from idle sites.
			eventually(t, home+" drains", 15*time.Second, func() bool {
				return sample(g.metricsOf("east", "gw"), "grid_route_site_rho", `site="`+home+`"`) < 0.5
			})
		}()
		eventually(t, "east's gateway reads "+home+" saturated", 15*time.Second, func() bool {
			return sample(g.metricsOf("east", "gw"), "grid_route_site_rho", `site="`+home+`"`) >= 0.99
		})
		// The bound site reads saturated, so the turn fails over to the
		// normal pick, which draws by predicted load: it may still land a
		// turn on the saturated site (whose queue the age-aware read drains
		// as the reading ages), and that turn's binding fails over again.
		// Within three turns the session is on the other site.
		got := ""
		for n := 1; n <= 3 && got != other; n++ {
			got = turn(t, entry, "chat-3", n)
		}
		if got != other {
			g.logRouting(t)
			t.Fatalf("with %s saturated the session stayed there for three turns", home)
		}
		eventually(t, "the failover is counted", 5*time.Second, func() bool { return affinity("failover") >= before+1 })
	})

	t.Run("existing_only keeps its sessions and takes no new one", func(t *testing.T) {
		g.t = t
		// A session bound to each site.
		bound := map[string]string{}
		for n := 0; len(bound) < 2 && n < 200; n++ {
			key := fmt.Sprintf("drain-%d", n)
			if site := turn(t, entry, key, 0); site != "" && bound[site] == "" {
				bound[site] = key
			}
		}
		if len(bound) < 2 {
			t.Fatalf("sessions bound only to %v", bound)
		}
		g.reloadOperator("west", ", admission: existing_only")
		g.waitReady("east", "west", false, 15*time.Second)
		for n := 1; n <= 10; n++ {
			if got := turn(t, entry, bound["west"], n); got != "west" {
				g.logRouting(t)
				t.Fatalf("turn %d of a session bound to draining west went to %q", n, got)
			}
		}
		for n := range 30 {
			if got := turn(t, entry, fmt.Sprintf("new-%d", n), 0); got != "east" {
				t.Fatalf("new session %d went to %q while west takes existing sessions only", n, got)
			}
		}
		if got := turn(t, entry, "", 0); got != "east" {
			t.Fatalf("a request without a session went to %q", got)
		}
		if out := httpGet("http://" + g.sites["west"].opMetrics + "/metrics"); !strings.Contains(out, `grid_provider_admission{admission="existing_only",grid_provider="west-pool",grid_site="west"} 1`) {
			t.Error("west's operator does not export its admission")
		}
		g.reloadOperator("west", "")
		g.waitReady("east", "west", true, 15*time.Second)
	})
}
