package operator

import (
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/route"
)

// scaledOperator is site s00 of a grid of n sites that each run 16 EPP
// providers, with every peer's last answer ingested.
type scaledOperator struct {
	op      *Operator
	answers map[string][]byte // peer -> its answer
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
	op := newPeeringOperator(tb, "s00", peers...)
	s := &scaledOperator{op: op, answers: map[string][]byte{}}
	now := time.Now().UnixMilli()
	for _, ps := range op.poller.snapshot() {
		s.answers[ps.cfg.Site] = peerAnswer(ps.cfg.Site, now)
	}
	s.pollRound()
	return s
}

// pollRound ingests every peer's answer, as one round of peer polls does
// after the network.
func (s *scaledOperator) pollRound() {
	for _, ps := range s.op.poller.snapshot() {
		s.op.poller.ingest(ps, s.answers[ps.cfg.Site], time.Now())
	}
}

// relay renders what the site's gateway reads: site and peer rows.
func (s *scaledOperator) relay() []byte {
	now := time.Now()
	var a answer
	s.op.render(&a, "site", s.op.site.Current(now), now, selection{})
	s.op.render(&a, "peers", s.op.peerStore.Current(now), now, selection{})
	return a.body
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
			var size int
			b.ReportAllocs()
			for b.Loop() {
				size = len(s.relay())
			}
			b.ReportMetric(float64(size), "relay-bytes")
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
}

func newSiteGateway(sites int) *siteGateway {
	g := &siteGateway{store: loadstore.New(time.Minute), builder: route.NewBuilder()}
	for i := range sites {
		site := fmt.Sprintf("s%02d", i)
		for p := range providersPerSite {
			g.cands = append(g.cands, route.Candidate{Model: fmt.Sprintf("m%d", p%4), Site: site,
				Provider: fmt.Sprintf("pool-%02d", p), Upstream: &url.URL{Scheme: "https", Host: site}, Local: i == 0})
		}
	}
	return g
}

// poll is what the gateway does with one relay: ingest, then rebuild.
func (g *siteGateway) ingest(relay []byte) loadstore.Result {
	now := time.Now().UnixMilli()
	return g.store.Ingest(relay, now, now, now, "s00", true)
}

func (g *siteGateway) rebuild() *route.Snapshot {
	return g.builder.Build(g.store, g.cands, time.Now().UnixMilli(), nil, route.DefaultSettings)
}

// BenchmarkGatewayIngest is the site gateway's share of each poll as the
// grid grows: ingesting the relay into its load store, then rebuilding its
// route snapshot from it.
func BenchmarkGatewayIngest(b *testing.B) {
	for _, n := range gridSizes {
		relay := newScaledOperator(b, n).relay()
		b.Run(fmt.Sprintf("sites=%d/ingest", n), func(b *testing.B) {
			g := newSiteGateway(n)
			b.ReportAllocs()
			b.SetBytes(int64(len(relay)))
			for b.Loop() {
				g.ingest(relay)
			}
		})
		b.Run(fmt.Sprintf("sites=%d/rebuild", n), func(b *testing.B) {
			g := newSiteGateway(n)
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
		batches := strings.Count(string(relay), "grid_provider_config_generation{")
		operatorHeld := float64(after.HeapAlloc-min(after.HeapAlloc, before.HeapAlloc)) / (1 << 20)

		// The gateway reading that relay: five polls' worth in its store
		// and the snapshot built from them.
		g := newSiteGateway(n)
		for range 5 {
			if res := g.ingest(relay); len(res.Dropped) > 0 {
				t.Errorf("%d sites: gateway dropped %v of its operator's relay", n, res.Dropped)
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
		t.Logf("%3d sites × %d providers: relay %7d bytes (%d of %d peer providers' batches), operator holds %5.1f MiB; gateway holds %5.1f MiB, %d of %d candidates measured",
			n, providersPerSite, len(relay), batches, (n-1)*providersPerSite, operatorHeld, gatewayHeld, measured, len(snap.Candidates))
		if len(relay) > 768<<10 {
			t.Errorf("relay of %d bytes over its 768 KiB bound", len(relay))
		}
		if measured != batches {
			t.Errorf("%d sites: gateway measured %d candidates, the relay carried %d batches", n, measured, batches)
		}
		runtime.KeepAlive(s)
		runtime.KeepAlive(g)
	}
}
