package operator

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/signals"
)

// scaledOperator is site s00 of a grid of n sites that each run 16 EPP
// providers, with every peer's last answer ingested.
type scaledOperator struct {
	op      *Operator
	answers map[string][]byte // peer -> its answer
	// at is the one instant the peers' rows are stamped, polled and
	// relayed at, and the gateway reads them at: a machine slow enough to
	// take longer than a load window between the steps must not make the
	// rows stale.
	at time.Time
}

const providersPerSite = 16

// peerAnswer is what a peer site publishes for its 16 providers: the EPP
// pool rows an operator relays, and each provider's batch line.
func peerAnswer(site string, now int64) []byte {
	var b strings.Builder
	for p := range providersPerSite {
		prov := fmt.Sprintf("pool-%02d", p)
		lbl := fmt.Sprintf(`grid_provider=%q,grid_site=%q`, prov, site)
		rows := []string{
			fmt.Sprintf(`llm_d_epp_average_running_requests{%s,name="p"} 6 %d`, lbl, now),
			fmt.Sprintf(`llm_d_epp_average_queue_size{%s,name="p"} 1 %d`, lbl, now),
			fmt.Sprintf(`llm_d_epp_ready_endpoints{%s,name="p"} 4 %d`, lbl, now),
			fmt.Sprintf(`llm_d_epp_average_kv_cache_utilization{%s,name="p"} 0.4 %d`, lbl, now),
			fmt.Sprintf(`grid_provider_info{%s,model="Qwen/Qwen3-8B"} 1 %d`, lbl, now),
			fmt.Sprintf(`grid_provider_ready{%s} 1 %d`, lbl, now),
			fmt.Sprintf(`grid_provider_ready_endpoints{%s} 4 %d`, lbl, now),
			fmt.Sprintf(`grid_provider_in_flight_requests{%s} 28 %d`, lbl, now),
			fmt.Sprintf(`grid_provider_ttft_p50_seconds{%s} 0.12 %d`, lbl, now),
			fmt.Sprintf(`grid_provider_error_ratio{%s} 0 %d`, lbl, now),
		}
		for _, r := range rows {
			b.WriteString(r + "\n")
		}
		fmt.Fprintf(&b, "grid_provider_config_generation{batch_samples=\"%d\",batch_sequence=\"1\",%s,provider_uid=\"u-%s\",publisher_epoch=\"%d\"} 1 %d\n",
			len(rows), lbl, prov, now-1000, now)
	}
	return []byte(b.String())
}

func newScaledOperator(tb testing.TB, sites int) *scaledOperator {
	tb.Helper()
	var peers []string
	for i := 1; i < sites; i++ {
		peers = append(peers, fmt.Sprintf("s%02d", i))
	}
	// The operator restamps what it admits on its own clock: a fake one
	// reading the instant the answers are dated, so building a 100-site
	// grid on a busy machine does not age the relay past its Date.
	at := time.Now()
	op := newPeeringOperatorOn(tb, clock.NewFake(at), "s00", peers...)
	s := &scaledOperator{op: op, answers: map[string][]byte{}, at: at}
	for _, ps := range op.poller.snapshot() {
		s.answers[ps.cfg.Site] = peerAnswer(ps.cfg.Site, s.at.UnixMilli())
	}
	s.pollRound()
	return s
}

// pollRound ingests every peer's answer, as one round of peer polls does
// after the network.
func (s *scaledOperator) pollRound() {
	for _, ps := range s.op.poller.snapshot() {
		s.op.poller.ingest(ps, s.answers[ps.cfg.Site], s.at)
	}
}

// relay renders what the site's gateway reads, page by page as it asks:
// site and peer rows.
func (s *scaledOperator) relay() [][]byte {
	now := s.at
	var pages [][]byte
	var after signals.Cursor
	for {
		a := s.op.signalsAnswer(now, selection{}, true, after)
		pages = append(pages, a.body)
		next, ok := a.nextPage()
		if !ok {
			return pages
		}
		after = next
	}
}

func size(pages [][]byte) (n int) {
	for _, p := range pages {
		n += len(p)
	}
	return n
}

var gridSizes = []int{3, 10, 30, 100}

// BenchmarkPeerRound is one round of peer polls as the grid grows (ingest
// only: the TLS and network of each poll are the peer's cost to answer).
func BenchmarkPeerRound(b *testing.B) {
	for _, n := range gridSizes {
		b.Run(fmt.Sprintf("sites=%d", n), func(b *testing.B) {
			s := newScaledOperator(b, n)
			b.ReportAllocs()
			for b.Loop() {
				s.pollRound()
			}
		})
	}
}

// BenchmarkRelay is rendering the relay the site's gateway polls every
// second, and reports its size.
func BenchmarkRelay(b *testing.B) {
	for _, n := range gridSizes {
		b.Run(fmt.Sprintf("sites=%d", n), func(b *testing.B) {
			s := newScaledOperator(b, n)
			var pages [][]byte
			b.ReportAllocs()
			for b.Loop() {
				pages = s.relay()
			}
			b.ReportMetric(float64(size(pages)), "relay-bytes")
			b.ReportMetric(float64(len(pages)), "pages")
		})
	}
}

// siteGateway is the gateway of site s00 reading its operator's relay: its
// load store and snapshot builder, and a candidate for every provider of
// every site (models spread over four names).
type siteGateway struct {
	store   *loadstore.Store
	builder *route.Builder
	cands   []route.Candidate
	nowMs   int64 // the operator's instant (scaledOperator.at)
}

func newSiteGateway(sites int, at time.Time) *siteGateway {
	g := &siteGateway{nowMs: at.UnixMilli(), store: loadstore.New(time.Minute), builder: route.NewBuilder(route.NewAgeAware(&route.Service{}, route.AgeAwareOptions{}))}
	for i := range sites {
		site := fmt.Sprintf("s%02d", i)
		for p := range providersPerSite {
			g.cands = append(g.cands, route.Candidate{Model: fmt.Sprintf("m%d", p%4), Site: site,
				Provider: fmt.Sprintf("pool-%02d", p), Upstream: &url.URL{Scheme: "https", Host: site}, Local: i == 0})
		}
	}
	return g
}

// ingest is what the gateway does with one relay, page by page; it
// returns the refusals.
func (g *siteGateway) ingest(relay [][]byte) signals.Tally {
	now := g.nowMs
	var refused signals.Tally
	for _, page := range relay {
		res := g.store.Ingest(page, now, now, now, signals.Origin{Site: "s00", Relay: true})
		for _, r := range signals.Refusals() {
			refused.Add(r, res.Refused[r])
		}
	}
	return refused
}

func (g *siteGateway) rebuild() *route.Snapshot {
	return g.builder.Build(g.store, g.cands, g.nowMs, nil, route.DefaultSettings)
}

// BenchmarkGatewayIngest is the site gateway's share of each poll as the
// grid grows: ingesting the relay into its load store, then rebuilding its
// route snapshot from it.
func BenchmarkGatewayIngest(b *testing.B) {
	for _, n := range gridSizes {
		s := newScaledOperator(b, n)
		relay := s.relay()
		b.Run(fmt.Sprintf("sites=%d/ingest", n), func(b *testing.B) {
			g := newSiteGateway(n, s.at)
			b.ReportAllocs()
			b.SetBytes(int64(size(relay)))
			for b.Loop() {
				g.ingest(relay)
			}
		})
		b.Run(fmt.Sprintf("sites=%d/rebuild", n), func(b *testing.B) {
			g := newSiteGateway(n, s.at)
			g.ingest(relay)
			b.ReportAllocs()
			for b.Loop() {
				g.rebuild()
			}
		})
	}
}

// TestGridScaleFootprint reports the operator's held memory and its relay
// as the grid grows, and checks the relay stays within its bound.
func TestGridScaleFootprint(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 100-site grid")
	}
	for _, n := range gridSizes {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s := newScaledOperator(t, n)
		relay := s.relay()
		runtime.GC()
		runtime.ReadMemStats(&after)
		batches := 0
		for _, page := range relay {
			batches += strings.Count(string(page), "grid_provider_config_generation{")
			if len(page) > signals.RelayBodyBytes {
				t.Errorf("%d sites: a relay page of %d bytes, over its 768 KiB bound", n, len(page))
			}
		}
		operatorHeld := float64(after.HeapAlloc-min(after.HeapAlloc, before.HeapAlloc)) / (1 << 20)

		// The gateway reading that relay: five polls' worth in its store
		// and the snapshot built from them.
		g := newSiteGateway(n, s.at)
		for range 5 {
			if refused := g.ingest(relay); refused.Total() > 0 {
				t.Errorf("%d sites: gateway refused %v of its operator's relay", n, refused)
			}
		}
		snap := g.rebuild()
		runtime.GC()
		var held runtime.MemStats
		runtime.ReadMemStats(&held)
		gatewayHeld := float64(held.HeapAlloc-min(held.HeapAlloc, after.HeapAlloc)) / (1 << 20)
		measured := 0
		for _, c := range snap.Candidates {
			if c.Measured {
				measured++
			}
		}
		t.Logf("%3d sites × %d providers: relay %7d bytes in %d pages (%d peer providers' batches), operator holds %5.1f MiB; gateway holds %5.1f MiB, %d of %d candidates measured",
			n, providersPerSite, size(relay), len(relay), batches, operatorHeld, gatewayHeld, measured, len(snap.Candidates))
		if want := (n - 1) * providersPerSite; batches != want {
			t.Errorf("%d sites: the relay carried %d peer batches, want every one of %d", n, batches, want)
		}
		if measured != batches {
			t.Errorf("%d sites: gateway measured %d candidates, the relay carried %d batches", n, measured, batches)
		}
		runtime.KeepAlive(s)
		runtime.KeepAlive(g)
	}
}

// TestRelayPages: at 100 sites the relay is past one answer's cap, so the
// site's gateway reads it in pages, each under the cap and made of whole
// batches, together carrying every peer provider once. A peer caller is
// never paged, and a cursor that is not one is refused.
func TestRelayPages(t *testing.T) {
	s := newScaledOperator(t, 100)
	h := s.op.SignalsHandler()
	own, err := s.op.id.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := idSource(t, pki(t, "s01"), "s01").GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	get := func(leaf *x509.Certificate, query string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, signals.SignalsPath+query, nil)
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	seen := map[string]int{}
	pages := 0
	for query := ""; ; pages++ {
		rec := get(own.Certificates[0], query)
		if rec.Code != http.StatusOK || rec.Body.Len() > signals.RelayBodyBytes {
			t.Fatalf("page %d: %d, %d bytes", pages, rec.Code, rec.Body.Len())
		}
		rows := map[string]int{}
		drops, err := signals.Parse(rec.Body.Bytes(), func(st *signals.Stamped) {
			site, _ := st.Label(signals.LabelSite)
			prov, _ := st.Label(signals.LabelProvider)
			rows[site+"/"+prov]++
		})
		if err != nil || drops != 0 {
			t.Fatalf("page %d: %v, %d lines unparsed", pages, err, drops)
		}
		for target, n := range rows {
			if n != 11 { // 10 rows and the batch line: whole batches only
				t.Errorf("page %d carries %d rows of %s", pages, n, target)
			}
			seen[target]++
		}
		next := rec.Header().Get(signals.RelayNextHeader)
		if next == "" {
			break
		}
		query = "?after=" + url.QueryEscape(next)
	}
	if pages < 2 || len(seen) != 99*providersPerSite {
		t.Errorf("%d pages carried %d targets, want every one of %d", pages+1, len(seen), 99*providersPerSite)
	}
	for target, n := range seen {
		if n != 1 {
			t.Errorf("%s carried %d times", target, n)
		}
	}
	if v := testutil.ToFloat64(s.op.m.peers.truncated.WithLabelValues(string(signals.StorePeers), "target")); v != 0 {
		t.Errorf("paging counted %v truncated targets", v)
	}

	if rec := get(peer.Certificates[0], "?after=peers:s50/pool-00"); rec.Code != http.StatusOK || rec.Header().Get(signals.RelayNextHeader) != "" {
		t.Errorf("peer caller: %d, next %q", rec.Code, rec.Header().Get(signals.RelayNextHeader))
	}
	for _, bad := range []string{"s50/pool-00", "nowhere:x", "peers:"} {
		if rec := get(own.Certificates[0], "?after="+url.QueryEscape(bad)); rec.Code != http.StatusBadRequest {
			t.Errorf("after=%q: %d, want 400", bad, rec.Code)
		}
	}
}
