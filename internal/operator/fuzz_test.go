package operator

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/signals"
)

// FuzzPeerIngest feeds arbitrary answers of peer west to east's ingest:
// nothing panics, and whatever is kept speaks for west only, with finite
// values, within the per-peer provider cap.
func FuzzPeerIngest(f *testing.F) {
	op := newPeeringOperator(f, "east", "west")
	peer := op.poller.snapshot()[0]

	now := time.Now().UnixMilli()
	f.Add([]byte(batch("west", "a", now-1000, 1, now)))
	f.Add([]byte(batch("west", "a", now-1000, 2, now, `llm_d_epp_average_queue_size{grid_provider="a",grid_site="west",name="a"} 3 `+itoa(now))))
	f.Add([]byte(batch("south", "a", now-1000, 1, now))) // a third site: refused
	f.Add([]byte(`grid_provider_ready{grid_provider="a",grid_site="west"} NaN ` + itoa(now) + "\n"))
	f.Add([]byte(`grid_provider_ready{grid_provider="a/b",grid_site="west"} 1 1` + "\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		op.poller.ingest(peer, body, time.Now())
		providers := 0
		for _, e := range op.PeerStore().Current(time.Now()) {
			if !strings.HasPrefix(e.Target, "west/") {
				t.Fatalf("kept target %q from west's answer", e.Target)
			}
			providers++
			for _, r := range e.Rows {
				if s, _ := r.Label(signals.LabelSite); s != "west" {
					t.Fatalf("kept a row for site %q from west's answer", s)
				}
				if math.IsNaN(r.Value) || math.IsInf(r.Value, 0) || r.Value < 0 {
					t.Fatalf("kept value %v", r.Value)
				}
			}
		}
		if providers > signals.MaxPeerProviders {
			t.Fatalf("%d providers kept for one peer", providers)
		}
	})
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// newPeeringOperator is an operator of site that peers with peers, neither
// scraping nor serving: for tests that drive its ingest directly.
func newPeeringOperator(tb testing.TB, site string, peers ...string) *Operator {
	tb.Helper()
	return newPeeringOperatorOn(tb, clock.Real{}, site, peers...)
}

// newPeeringOperatorOn is newPeeringOperator on the clock clk.
func newPeeringOperatorOn(tb testing.TB, clk clock.Clock, site string, peers ...string) *Operator {
	tb.Helper()
	dir := pki(tb, site)
	c := &config.Operator{Site: site, StateDir: tb.TempDir(), TLS: tlsFiles(dir, site)}
	for _, p := range peers {
		c.Peers = append(c.Peers, config.Peer{Site: p, Signals: "https://127.0.0.1:1"})
	}
	cfg := reparse(tb, c)
	state, err := OpenState(cfg.StateDir, time.Now().UnixMilli(), nil, OpenOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	op, err := New(cfg, state, Options{Clock: clk, Identity: idSource(tb, dir, site)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { op.Close() })
	return op
}
