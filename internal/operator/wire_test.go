package operator

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/signals"
)

// TestLocalReadIsTheProtocolExample renders the worked example of
// docs/protocol.md §2.1 (a Local read on site hub: one local provider, one
// relayed peer provider) and compares it, headers and body, with the example
// as printed there (testdata/local-read.txt).
func TestLocalReadIsTheProtocolExample(t *testing.T) {
	want, err := os.ReadFile("testdata/local-read.txt")
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(want), "\n\n")
	clk := clock.NewFake(time.UnixMilli(1787220007300))
	op := newPeeringOperatorOn(t, clk, "hub", "east")

	// The example's rows, stored as the scrape and the peer poll store them:
	// collected at their stamps.
	entries := map[string]*Entry{}
	var order []string
	if _, err := signals.Parse([]byte(body), func(st *signals.Stamped) {
		site, _ := st.Label(signals.LabelSite)
		prov, _ := st.Label(signals.LabelProvider)
		target := site + "/" + prov
		e := entries[target]
		if e == nil {
			e = &Entry{Target: target, CollectedAt: time.UnixMilli(st.StampMs), ExpiresAt: time.UnixMilli(st.StampMs).Add(time.Minute)}
			entries[target] = e
			order = append(order, target)
		}
		e.Rows = append(e.Rows, st.Row)
	}); err != nil {
		t.Fatal(err)
	}
	if len(order) != 2 {
		t.Fatalf("the example holds %v", order)
	}
	op.SiteStore().PutEntry(entries["hub/pool-a"])
	op.PeerStore().PutEntry(entries["east/pool-b"])

	own, err := op.id.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, signals.SignalsPath, nil)
	r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{own.Certificates[0]}}
	rec := httptest.NewRecorder()
	op.SignalsHandler().ServeHTTP(rec, r)
	got := fmt.Sprintf("HTTP/1.1 %d %s\ncontent-type: %s\nage: %s\ndate: %s\n\n%s",
		rec.Code, http.StatusText(rec.Code), rec.Header().Get("Content-Type"), rec.Header().Get("Age"), rec.Header().Get("Date"), rec.Body.String())
	if got != string(want) {
		t.Errorf("Local read:\n%s\nwant (docs/protocol.md §2.1):\n%s", got, want)
	}
}

// TestPeerReadsOnlySharedModels: peers[].models restricts what a peer reads
// of this site to the providers of those models; the site's own gateway
// (Local) still reads everything, and a peer with no list reads everything.
func TestPeerReadsOnlySharedModels(t *testing.T) {
	dir := pki(t, "hub", "east", "west")
	ps := providers("shared-pool", "private-pool")
	ps[0].Model, ps[1].Model = "shared", "private"
	c := &config.Operator{Site: "hub", StateDir: t.TempDir(), TLS: tlsFiles(dir, "hub"), Providers: ps,
		Peers: []config.Peer{{Site: "east", Signals: "https://127.0.0.1:1", Models: []string{"shared"}}, {Site: "west", Signals: "https://127.0.0.1:2"}}}
	cfg := reparse(t, c)
	state, err := OpenState(cfg.StateDir, time.Now().UnixMilli(), cfg.Providers, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := New(cfg, state, Options{Identity: idSource(t, dir, "hub")})
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	now := time.Now()
	for _, p := range []string{"shared-pool", "private-pool"} {
		op.SiteStore().PutEntry(&Entry{Target: p, CollectedAt: now, ExpiresAt: now.Add(time.Minute), Rows: []signals.Row{
			{Name: signals.Ready, Labels: []signals.Label{{Name: signals.LabelProvider, Value: p}, {Name: signals.LabelSite, Value: "hub"}}, Value: 1}}})
	}
	read := func(as string) string {
		src := idSource(t, dir, as)
		svid, err := src.GetX509SVID()
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodGet, signals.SignalsPath, nil)
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{svid.Certificates[0]}}
		rec := httptest.NewRecorder()
		op.SignalsHandler().ServeHTTP(rec, r)
		if rec.Code != 200 {
			t.Fatalf("%s: %d", as, rec.Code)
		}
		return rec.Body.String()
	}
	for _, tc := range []struct {
		as              string
		shared, private bool
	}{{"east", true, false}, {"west", true, true}, {"hub", true, true}} {
		body := read(tc.as)
		if strings.Contains(body, `"shared-pool"`) != tc.shared || strings.Contains(body, `"private-pool"`) != tc.private {
			t.Errorf("%s reads:\n%s", tc.as, body)
		}
	}
}
