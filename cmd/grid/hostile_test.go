package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLyingPeerCannotBuyTraffic runs three sites of real processes on
// loopback: east, whose gateway the clients call, with a 16-slot engine;
// west, an honest site with the same; and north, a site with a valid grid
// certificate whose operator relays claimed idle providers of 16 slots:
// their metrics come from an engine nothing is sent to, while every
// request north's gateway takes goes to one 4-slot engine. North claims
// one provider, then 64. Believed, north would draw a third of east's
// requests; by what it serves, a ninth.
//
// With an 8-slot engine behind north (up to commit 0deb065) the test was
// marginal: north drew about a third of east's 24 streams, eight at a
// time, which its engine served without a queue, so its answers hardly
// contradicted its claim, and in one clean-clone CI run of several east
// never read north below 0.9 (history of the rules that made the
// difference: docs/security.md). With four slots the lie is plain: in
// four runs, two with both cores busy, north drew 0.14-0.18 of east's
// requests either way, west 0.36-0.42, and east read north below 0.9 of
// its claims in 25-31 of 32-34 samples of each run (at the 0.05 floor),
// west in none. A clean-clone CI run read north below 0.9 in only 13 of 32
// samples claiming one provider, and north drew 0.07: a site out of the
// draws sends no answers to contradict it, its distrust fades, and it is
// tried again.
//
// Asserted, with margin: north under 0.30 of east's requests, west at
// least 0.25; east reads north below 0.9 in at least a tenth of the
// samples of each run, and west at 0.9 or more in at least four in five
// (with both cores busy a stall delays every stream a site holds at once,
// and each is judged as a wait: CI read honest west at 0.58 for a moment;
// docs/design/routing-experiments.md).
func TestLyingPeerCannotBuyTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("three sites of real processes under load")
	}
	for _, claimed := range []int{1, 64} {
		share, trust := runLyingPeer(t, claimed)
		t.Logf("north claims %d provider(s): shares of east's requests %v; trust east read %v", claimed, share, trust)
		if s := share["north"]; s >= 0.30 {
			t.Errorf("claiming %d provider(s) north draws %.2f of east's requests, serving a ninth of the capacity", claimed, s)
		}
		if s := share["west"]; s < 0.25 {
			t.Errorf("north claiming %d: west, with room, drew %.2f (its capacity share %.2f)", claimed, s, 16.0/36)
		}
		if w := trust["west"]; w.samples == 0 || float64(w.below) > 0.2*float64(w.samples) {
			t.Errorf("north claiming %d: east read honest west below 0.9 of its claims in %d of %d samples (least %.2f)", claimed, w.below, w.samples, w.least)
		}
		if n := trust["north"]; n.samples == 0 || 10*n.below < n.samples {
			t.Errorf("north claiming %d idle provider(s) while its requests queue: east read it below 0.9 of its claims in only %d of %d samples", claimed, n.below, n.samples)
		}
	}
}

// trustSamples is what east's gateway published of one remote site's
// trust while the load ran: how many samples, how many below 0.9, and the
// least.
type trustSamples struct {
	samples, below int
	least          float64
}

func (s trustSamples) String() string {
	return fmt.Sprintf("least %.2f, %d of %d below 0.9", s.least, s.below, s.samples)
}

// runLyingPeer starts the three sites with north claiming claimed
// providers, sends east's gateway 24 concurrent clients of ~1 s streamed
// chat completions for 15 s (longer, up to 45 s, until 200 have been
// answered) once all three sites are drawn on, and returns each site's
// share of the answers and the trust east's gateway published for each
// remote site, read every half second while the load ran.
func runLyingPeer(t *testing.T, claimed int) (share map[string]float64, trust map[string]trustSamples) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	gridCerts(t, certs, "east", "west", "north")
	type site struct {
		engine, metrics                 string // the serving engine, and where its providers' metrics come from
		signals, opMetrics, client, hop string
		gwMetrics                       string
		peers                           []string
		providers                       int
	}
	sites := map[string]*site{
		"east":  {peers: []string{"west", "north"}, providers: 1},
		"west":  {peers: []string{"east"}, providers: 1},
		"north": {peers: []string{"east"}, providers: claimed},
	}
	names := []string{"east", "west", "north"}
	for _, n := range names {
		s := sites[n]
		s.engine, s.signals, s.opMetrics, s.client, s.hop, s.gwMetrics = freePort(t), freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)
		endpoints, slots := "2", "8"
		if n == "north" {
			endpoints, slots = "1", "4"
		}
		start(t, "sim", "--kind", "epp", "--listen", s.engine, "--endpoints", endpoints, "--slots", slots, "--ttft", "10ms", "--tpot", "5ms")
		s.metrics = s.engine
		if n == "north" {
			// North's providers report an engine nothing is sent to: idle,
			// whatever north's gateway holds, with as many ready endpoints
			// as east and west (a claim of more is its own attack:
			// docs/security.md).
			s.metrics = freePort(t)
			start(t, "sim", "--kind", "epp", "--listen", s.metrics, "--endpoints", "2", "--slots", "8")
		}
	}
	for _, n := range names {
		s := sites[n]
		tlsBlock := fmt.Sprintf("tls: {ca: %[1]s/ca.crt, cert: %[1]s/%[2]s.crt, key: %[1]s/%[2]s.key}", certs, n)
		var peers, providers strings.Builder
		for _, p := range s.peers {
			fmt.Fprintf(&peers, "  - {site: %s, signals: \"https://%s\", gateway: \"https://%s\"}\n", p, sites[p].signals, sites[p].hop)
		}
		for i := range s.providers {
			fmt.Fprintf(&providers, "  - {name: %s-%02d, model: Qwen/Qwen3-8B, kind: epp, upstream: \"http://%s\", metrics: {endpoint: \"http://%s\", staleAfter: 2s}}\n",
				n, i, s.engine, s.metrics)
		}
		op := fmt.Sprintf("site: %s\n%s\nsignals: {listen: %q}\nmetrics: {listen: %q}\nstateDir: %s\nscrapeInterval: 200ms\npeerPollInterval: 1s\npeerPoll: {ttl: 4s, timeout: 1s, budget: 2s}\npeers:\n%sproviders:\n%s",
			n, tlsBlock, s.signals, s.opMetrics, filepath.Join(dir, "state-"+n), peers.String(), providers.String())
		gw := fmt.Sprintf("site: %s\n%s\nlisten: %q\nhop: {listen: %q}\nmetrics: {listen: %q}\noperator: {signals: \"https://%s\"}\npollInterval: 500ms\n",
			n, tlsBlock, s.client, s.hop, s.gwMetrics, s.signals)
		opFile, gwFile := filepath.Join(dir, n+"-operator.yaml"), filepath.Join(dir, n+"-gateway.yaml")
		os.WriteFile(opFile, []byte(op), 0o600)
		os.WriteFile(gwFile, []byte(gw), 0o600)
		start(t, "operator", "--config", opFile)
		start(t, "gateway", "--config", gwFile)
	}
	east := sites["east"]
	eventually(t, "east's gateway answers", 15*time.Second, func() bool { return httpGet("http://"+east.client+"/v1/models") != "" })
	g := &faultGrid{t: t, sites: map[string]*faultSite{"east": {gwMetrics: east.gwMetrics}}}
	for _, n := range names {
		g.waitReady("east", n, true, 30*time.Second)
	}

	var mu sync.Mutex
	served := map[string]int{}
	total := 0
	// 15 s of load, longer until 200 answers (at most 45 s): a machine
	// busy with other tests' processes answers fewer streams a second, and
	// the shares need enough of them.
	began := time.Now()
	more := func() bool {
		mu.Lock()
		defer mu.Unlock()
		elapsed := time.Since(began)
		return elapsed < 15*time.Second || total < 200 && elapsed < 45*time.Second
	}
	trust = map[string]trustSamples{"west": {least: 1}, "north": {least: 1}}
	stopReading := make(chan struct{})
	var reader sync.WaitGroup
	reader.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopReading:
				return
			case <-tick.C:
			}
			m := httpGet("http://" + east.gwMetrics + "/metrics")
			for site, ts := range trust {
				if tr := sample(m, "grid_route_site_trust", `site="`+site+`"`); tr >= 0 {
					ts.samples++
					if tr < 0.9 {
						ts.below++
					}
					ts.least = min(ts.least, tr)
					trust[site] = ts
				}
			}
		}
	})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for range 24 {
		wg.Go(func() {
			for more() {
				resp, err := client.Post("http://"+east.client+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"hi"}],"max_tokens":200,"stream":true}`))
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				if resp.StatusCode == http.StatusOK {
					served[resp.Header.Get("X-Grid-Site")]++
				}
				total++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stopReading)
	reader.Wait()
	if served["west"] == 0 || served["north"] == 0 {
		t.Logf("north claiming %d, a remote site drew nothing; east's snapshot: %s", claimed, httpGet("http://"+east.gwMetrics+"/api/snapshot"))
		for _, n := range names {
			for _, l := range strings.Split(httpGet("http://"+sites[n].gwMetrics+"/metrics"), "\n") {
				if strings.HasPrefix(l, "grid_gateway_upstream") || strings.HasPrefix(l, "grid_gateway_decisions") || strings.HasPrefix(l, "grid_gateway_hop_refused") {
					t.Log(n, " ", l)
				}
			}
		}
	}
	share = map[string]float64{}
	for site, n := range served {
		share[site] = float64(n) / float64(total)
	}
	if total < 100 {
		t.Fatalf("only %d answers in %v: %v", total, time.Since(began).Round(time.Second), served)
	}
	return share, trust
}
