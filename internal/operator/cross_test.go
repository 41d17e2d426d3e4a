package operator

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/grid-inference/grid/internal/sim"
)

// pki is a grid CA with certificates for the named sites.
func pki(t testing.TB, sites ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := identity.Init(dir, "grid.internal", time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, s := range sites {
		if err := identity.Issue(dir, s, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func tlsFiles(dir, site string) *config.TLS {
	crt, key := identity.SiteFiles(dir, site)
	return &config.TLS{CA: filepath.Join(dir, "ca.crt"), Cert: crt, Key: key}
}

func idSource(t testing.TB, dir, site string) *identity.Source {
	t.Helper()
	s, err := identity.LoadSource(*tlsFiles(dir, site), "grid.internal", site, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// site is a running operator with a signals listener.
type site struct {
	op   *Operator
	addr string
	stop func()
}

// startSite runs an operator for name with the given providers and peers
// (peers[i] = "name=url"), serving signals on addr (":0" for any).
func startSite(t *testing.T, dir, name, stateDir, addr string, providers []config.Provider, peers ...string) *site {
	t.Helper()
	return startSiteLimits(t, DefaultLimits, dir, name, stateDir, addr, providers, peers...)
}

func startSiteLimits(t *testing.T, lim Limits, dir, name, stateDir, addr string, providers []config.Provider, peers ...string) *site {
	t.Helper()
	return startSiteTuned(t, siteTuning{}, lim, dir, name, stateDir, addr, providers, peers...)
}

// siteTuning is what a test may change of a started site; zero fields keep
// the defaults of startSite.
type siteTuning struct {
	log *slog.Logger // nil: nowhere
	// peerTimeout and peerBudget bound one peer attempt and one poll
	// (default 500 ms and 1.5 s: tests of hung peers end quickly).
	peerTimeout, peerBudget time.Duration
}

// startSiteTuned is startSiteLimits with tuning applied.
func startSiteTuned(t *testing.T, tune siteTuning, lim Limits, dir, name, stateDir, addr string, providers []config.Provider, peers ...string) *site {
	t.Helper()
	cfg := &config.Operator{Site: name, StateDir: stateDir, Providers: providers, TLS: tlsFiles(dir, name)}
	for _, p := range peers {
		n, u, _ := strings.Cut(p, "=")
		cfg.Peers = append(cfg.Peers, config.Peer{Site: n, Signals: u})
	}
	cfg = reparse(t, cfg)
	cfg.PeerPoll.Timeout = config.Duration(cmp.Or(tune.peerTimeout, 500*time.Millisecond))
	cfg.PeerPoll.Budget = config.Duration(cmp.Or(tune.peerBudget, 1500*time.Millisecond))
	state, err := OpenState(cfg.StateDir, time.Now().UnixMilli(), cfg.Providers, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := New(cfg, state, Options{Clock: clock.Real{}, Logger: tune.log, Identity: idSource(t, dir, name)})
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { op.ServeSignals(ctx, ln, lim, time.Second); close(done) }()
	s := &site{op: op, addr: ln.Addr().String()}
	stopped := false
	s.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
			op.Close()
		}
	}
	t.Cleanup(s.stop)
	return s
}

// reparse runs a config through the real loader for defaults and validation.
func reparse(t testing.TB, c *config.Operator) *config.Operator {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "site: %s\nstateDir: %s\npeerPollInterval: 1s\n", c.Site, c.StateDir)
	if c.TLS != nil {
		fmt.Fprintf(&b, "tls: {ca: %q, cert: %q, key: %q}\n", c.TLS.CA, c.TLS.Cert, c.TLS.Key)
	}
	if len(c.Peers) > 0 {
		b.WriteString("peers:\n")
		for _, p := range c.Peers {
			models := ""
			if p.Models != nil {
				q := make([]string, len(p.Models))
				for i, m := range p.Models {
					q[i] = strconv.Quote(m)
				}
				models = ", models: [" + strings.Join(q, ", ") + "]"
			}
			fmt.Fprintf(&b, "  - {site: %s, signals: %q%s}\n", p.Site, p.Signals, models)
		}
	}
	if len(c.Providers) > 0 {
		b.WriteString("providers:\n")
		for _, p := range c.Providers {
			fmt.Fprintf(&b, "  - {name: %s, model: %q, kind: %s, upstream: %q, metrics: {endpoint: %q, timeout: 500ms}}\n",
				p.Name, p.Model, p.Kind, p.Upstream, p.Metrics.Endpoint)
		}
	}
	out, err := config.ParseOperator("test", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// get reads a signals endpoint with a client identity.
func get(t *testing.T, from *identity.Source, server, addr, path string) (*http.Response, string, error) {
	t.Helper()
	conf, err := from.ClientTLS(server)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 3 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + addr + path)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

func TestTwoOperatorsSeeEachOther(t *testing.T) {
	dir := pki(t, "east", "west", "north")
	eastSim := startSim(t, sim.Options{Kind: sim.KindEPP, Endpoints: 2})
	westSim := startSim(t, sim.Options{Kind: sim.KindSGLang})
	// Listen first so each knows the other's address.
	eastLn, _ := net.Listen("tcp", "127.0.0.1:0")
	westLn, _ := net.Listen("tcp", "127.0.0.1:0")
	eastAddr, westAddr := eastLn.Addr().String(), westLn.Addr().String()
	eastLn.Close()
	westLn.Close()
	east := startSite(t, dir, "east", t.TempDir(), eastAddr, []config.Provider{providerConf("east-pool", "epp", eastSim.URL)}, "west=https://"+westAddr)
	west := startSite(t, dir, "west", t.TempDir(), westAddr, []config.Provider{providerConf("west-pool", "sglang", westSim.URL)}, "east=https://"+eastAddr)
	ctx := context.Background()
	east.op.Pass(ctx)
	west.op.Pass(ctx)
	for range 2 { // within two peer polls
		east.op.PollPeers(ctx)
		west.op.PollPeers(ctx)
	}
	eastH := &harness{t: t, op: east.op}
	westH := &harness{t: t, op: west.op}
	if v := siteGauge(eastH, signals.Ready, "west", "west-pool"); v != 1 {
		t.Errorf("east sees west's provider ready = %v", v)
	}
	if v := siteGauge(westH, signals.Ready, "east", "east-pool"); v != 1 {
		t.Errorf("west sees east's provider ready = %v", v)
	}

	eastID, westID, northID := idSource(t, dir, "east"), idSource(t, dir, "west"), idSource(t, dir, "north")
	// east's own certificate (its gateway): both sites' rows.
	resp, body, err := get(t, eastID, "east", eastAddr, signals.SignalsPath)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(body, `grid_site="east"`) || !strings.Contains(body, `grid_site="west"`) {
		t.Fatalf("Local read: %v %v\n%s", err, resp, body)
	}
	checkWire(t, resp, body)
	// west's certificate (a peer): east's rows only.
	resp, body, err = get(t, westID, "east", eastAddr, signals.SignalsPath)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(body, `grid_site="east"`) || strings.Contains(body, `grid_site="west"`) {
		t.Fatalf("Peer read: %v\n%s", err, body)
	}
	// A certificate from another CA: the handshake fails.
	foreign := idSource(t, pki(t, "west"), "west")
	if _, _, err := get(t, foreign, "east", eastAddr, signals.SignalsPath); err == nil {
		t.Error("a foreign CA's certificate was served")
	}
	// No client certificate: the handshake fails.
	anon, _ := eastID.ClientTLS("east")
	anon = anon.Clone()
	anon.Certificates, anon.GetClientCertificate = nil, nil
	nc := &http.Client{Transport: &http.Transport{TLSClientConfig: anon}, Timeout: 3 * time.Second}
	if r, err := nc.Get("https://" + eastAddr + signals.SignalsPath); err == nil {
		r.Body.Close()
		t.Errorf("a client without a certificate was served: %d", r.StatusCode)
	}
	nc.CloseIdleConnections()
	// A valid certificate of a site east does not peer with: 403.
	resp, body, err = get(t, northID, "east", eastAddr, signals.SignalsPath)
	if err != nil || resp.StatusCode != 403 || body != refusedBody {
		t.Errorf("north: %v %v %q", err, resp, body)
	}
	// Narrowing: collect[] and target only narrow.
	_, body, _ = get(t, westID, "east", eastAddr, signals.SignalsPath+"?collect[]=grid_provider_ready")
	if strings.Count(body, "\n") != 1 || !strings.HasPrefix(body, "grid_provider_ready{") {
		t.Errorf("collect[]: %q", body)
	}
	_, body, _ = get(t, westID, "east", eastAddr, signals.SignalsPath+"?target=west-pool")
	if body != "" {
		t.Errorf("a peer widened its read with target=: %q", body)
	}
	_, body, _ = get(t, eastID, "east", eastAddr, signals.SignalsPath+"?target=west-pool")
	if !strings.Contains(body, `grid_provider="west-pool"`) || strings.Contains(body, `grid_provider="east-pool"`) {
		t.Errorf("target=west-pool: %q", body)
	}
	resp, _, _ = get(t, eastID, "east", eastAddr, "/other")
	if resp.StatusCode != 404 {
		t.Errorf("other path: %d", resp.StatusCode)
	}
	conf, _ := eastID.ClientTLS("east")
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	r2, err := c.Post("https://"+eastAddr+signals.SignalsPath, "text/plain", nil)
	if err != nil || r2.StatusCode != 405 {
		t.Fatalf("POST: %v %v", err, r2)
	}
	r2.Body.Close()
	c.CloseIdleConnections()
}

// checkWire checks the §2.1 format: sorted labels, stamps from the Date's
// clock reading, no comments, an Age.
func checkWire(t *testing.T, resp *http.Response, body string) {
	t.Helper()
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		t.Fatalf("Date: %v", err)
	}
	if resp.Header.Get("Age") == "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Errorf("headers %v", resp.Header)
	}
	n := 0
	_, err = signals.Parse([]byte(body), func(s *signals.Stamped) {
		n++
		for i := 1; i < len(s.Labels); i++ {
			if s.Labels[i-1].Name >= s.Labels[i].Name {
				t.Errorf("labels not sorted: %v", s.Labels)
			}
		}
		if age, ok := signals.AgeMs(date.UnixMilli(), s.StampMs); !ok || age > 60_000 {
			t.Errorf("stamp %d against Date %v", s.StampMs, date)
		}
	})
	if err != nil || n == 0 || strings.Contains(body, "#") || strings.Contains(body, "e+") {
		t.Errorf("body %q (%d rows, %v)", body, n, err)
	}
}

func siteGauge(h *harness, name, site, prov string) float64 {
	f := h.scrapeMetrics()[name]
	for _, m := range f.GetMetric() {
		var s, p string
		for _, l := range m.Label {
			switch l.GetName() {
			case signals.LabelSite:
				s = l.GetValue()
			case signals.LabelProvider:
				p = l.GetValue()
			}
		}
		if s == site && p == prov {
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func TestImpostorIsRefused(t *testing.T) {
	dir := pki(t, "east", "north")
	north := startSite(t, dir, "north", t.TempDir(), "", nil)
	// east believes west lives where north answers.
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "west=https://"+north.addr)
	east.op.PollPeers(context.Background())
	if n := len(east.op.PeerStore().Current(time.Now())); n != 0 {
		t.Errorf("stored %d entries from an impostor", n)
	}
	if v := counterValue(t, east.op, "grid_peer_poll_total", "peer", "west", "outcome", OutcomeTLS); v != 1 {
		t.Errorf("tls outcomes %v", v)
	}
}

func counterValue(t *testing.T, op *Operator, family string, kv ...string) float64 {
	t.Helper()
	h := &harness{t: t, op: op}
	for _, m := range h.scrapeMetrics()[family].GetMetric() {
		match := true
		for i := 0; i+1 < len(kv); i += 2 {
			found := false
			for _, l := range m.Label {
				found = found || (l.GetName() == kv[i] && l.GetValue() == kv[i+1])
			}
			match = match && found
		}
		if match {
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	return -1
}

// fakePeer is a grid site "west" whose answers the test writes.
type fakePeer struct {
	addr   string
	answer atomic.Value // func(w http.ResponseWriter)
}

func startFakePeer(t *testing.T, dir, name string) *fakePeer {
	t.Helper()
	src := idSource(t, dir, name)
	fp := &fakePeer{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Not httptest: its StartTLS installs its own certificate.
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fp.answer.Load().(func(http.ResponseWriter, *http.Request))(w, r)
	}), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, src.ServerTLS()))
	t.Cleanup(func() { srv.Close() })
	fp.addr = ln.Addr().String()
	fp.set(func(w http.ResponseWriter, _ *http.Request) {})
	return fp
}

func (fp *fakePeer) set(f func(http.ResponseWriter, *http.Request)) { fp.answer.Store(f) }

// serve makes the peer answer body with a Date of date.
func (fp *fakePeer) serve(date time.Time, body string) {
	fp.set(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Date", date.UTC().Format(http.TimeFormat))
		io.WriteString(w, body)
	})
}

// batch renders a provider batch for site as an operator would.
func batch(site, provider string, epoch, seq int64, stampMs int64, extra ...string) string {
	rows := []string{
		fmt.Sprintf(`grid_provider_ready{grid_provider=%q,grid_site=%q} 1 %d`, provider, site, stampMs),
		fmt.Sprintf(`grid_provider_in_flight_requests{grid_provider=%q,grid_site=%q} 5 %d`, provider, site, stampMs),
	}
	rows = append(rows, extra...)
	rows = append(rows, fmt.Sprintf(`grid_provider_config_generation{batch_samples="%d",batch_sequence="%d",grid_provider=%q,grid_site=%q,provider_uid="u-%s",publisher_epoch="%d"} 1 %d`,
		len(rows), seq, provider, site, provider, epoch, stampMs))
	return strings.Join(rows, "\n") + "\n"
}

func stored(op *Operator) map[string][]signals.Row {
	out := map[string][]signals.Row{}
	for _, e := range op.PeerStore().Current(time.Now()) {
		out[e.Target] = e.Rows
	}
	return out
}

func TestPeerIngestRules(t *testing.T) {
	dir := pki(t, "east", "west")
	fp := startFakePeer(t, dir, "west")
	// Each poll of the answer over 1 MiB reads it three times: on a busy
	// machine that outlasts the short budget of startSite and reads as a
	// timeout, not the transport refusal asserted.
	patient := siteTuning{peerTimeout: 10 * time.Second, peerBudget: 30 * time.Second}
	east := startSiteTuned(t, patient, DefaultLimits, dir, "east", t.TempDir(), "", nil, "west=https://"+fp.addr)
	poll := func() { east.op.PollPeers(context.Background()) }
	refused := func(reason signals.Refusal) float64 {
		return counterValue(t, east.op, "grid_peer_signals_refused_total", "peer", "west", "reason", reason.PeerLabel())
	}
	now := time.Now()
	ms := now.UnixMilli()
	epoch := ms - 60_000

	t.Run("third site and spoofed site", func(t *testing.T) {
		fp.serve(now, batch("west", "a", epoch, 1, ms)+batch("north", "n", epoch, 1, ms)+batch("east", "e", epoch, 1, ms))
		poll()
		got := stored(east.op)
		if len(got) != 1 || got["west/a"] == nil {
			t.Fatalf("stored %v", got)
		}
		if refused(signals.RefuseSite) != 6 {
			t.Errorf("site refusals %v", refused(signals.RefuseSite))
		}
	})
	t.Run("values", func(t *testing.T) {
		body := batch("west", "a", epoch, 2, ms,
			fmt.Sprintf(`grid_provider_error_ratio{grid_provider="a",grid_site="west"} 1.5 %d`, ms),
			fmt.Sprintf(`llm_d_epp_average_queue_size{grid_provider="a",grid_site="west",name="a"} -1 %d`, ms),
			fmt.Sprintf(`llm_d_epp_average_running_requests{grid_provider="a",grid_site="west",name="a"} NaN %d`, ms),
			fmt.Sprintf(`go_goroutines{grid_provider="a",grid_site="west"} 7 %d`, ms))
		before := refused(signals.RefuseValue)
		fp.serve(now, body)
		poll()
		for _, r := range stored(east.op)["west/a"] {
			if r.Name == signals.ErrorRatio || r.Name == signals.EPPAverageQueue || r.Name == signals.EPPAverageRunning || r.Name == "go_goroutines" {
				t.Errorf("kept %s %v", r.Name, r.Value)
			}
		}
		if refused(signals.RefuseValue)-before != 2 || refused(signals.RefuseName) != 1 {
			t.Errorf("value refusals %v, name %v", refused(signals.RefuseValue)-before, refused(signals.RefuseName))
		}
	})
	t.Run("provider cap", func(t *testing.T) {
		var b strings.Builder
		for i := range 70 {
			b.WriteString(batch("west", fmt.Sprintf("p%02d", i), epoch, int64(10+i), ms))
		}
		fp.serve(now, b.String())
		poll()
		got := stored(east.op)
		if len(got) != 64 || got["west/p63"] == nil || got["west/p64"] != nil {
			t.Errorf("stored %d providers", len(got))
		}
		if refused(signals.RefuseProviderCap) != 6*3 {
			t.Errorf("provider_cap refusals %v", refused(signals.RefuseProviderCap))
		}
	})
	t.Run("ages", func(t *testing.T) {
		fp.serve(now, batch("west", "future", epoch, 100, ms+2000)+batch("west", "old", epoch, 101, ms-2*86_400_000)+batch("west", "fine", epoch, 102, ms-3000))
		poll()
		got := stored(east.op)
		if got["west/future"] != nil || got["west/old"] != nil || got["west/fine"] == nil {
			t.Errorf("stored %v", keys(got))
		}
		if refused(signals.RefuseAge) != 6 || len(east.op.PeerAgesRejected()) != 1 {
			t.Errorf("age refusals %v, rejected %v", refused(signals.RefuseAge), east.op.PeerAgesRejected())
		}
		// Kept rows are restamped as now minus their age, whatever the
		// peer's clock said.
		e := entry(east.op, "west/fine")
		// The Date header has one-second resolution: the age is 2-3s.
		if age := time.Since(e.CollectedAt); age < 1900*time.Millisecond || age > 5*time.Second {
			t.Errorf("restamped age %v, want about 3s", age)
		}
		// A clean answer clears PeerAgesRejected.
		fp.serve(now, batch("west", "fine", epoch, 103, ms))
		poll()
		if len(east.op.PeerAgesRejected()) != 0 {
			t.Error("PeerAgesRejected not cleared by a clean answer")
		}
	})
	t.Run("replayed older batch", func(t *testing.T) {
		fp.serve(now, batch("west", "r", epoch, 200, ms-1000))
		poll()
		fp.serve(now, batch("west", "r", epoch, 199, ms))
		poll()
		e := entry(east.op, "west/r")
		if e == nil || e.Batch.Sequence != 200 {
			t.Fatalf("entry %+v", e)
		}
		if refused(signals.RefuseDelayed) != 3 {
			t.Errorf("delayed refusals %v", refused(signals.RefuseDelayed))
		}
		// The same batch again is a republish: not a refusal, age kept.
		at := e.CollectedAt
		fp.serve(now.Add(5*time.Second), batch("west", "r", epoch, 200, ms+4000))
		poll()
		if e := entry(east.op, "west/r"); e == nil || !e.CollectedAt.Equal(at) || refused(signals.RefuseDelayed) != 3 {
			t.Errorf("republish changed the entry or was refused: %+v", e)
		}
	})
	t.Run("epoch eleven minutes ahead", func(t *testing.T) {
		fp.serve(now, batch("west", "z", ms+11*60_000, 1, ms))
		poll()
		if entry(east.op, "west/z") != nil || refused(signals.RefuseEpoch) != 3 {
			t.Fatalf("future epoch stored, refusals %v", refused(signals.RefuseEpoch))
		}
		// No fence was kept for it: a batch of a sane epoch is accepted.
		fp.serve(now, batch("west", "z", epoch, 1, ms))
		poll()
		if entry(east.op, "west/z") == nil {
			t.Error("a sane batch after a refused future epoch was not stored")
		}
	})
	t.Run("body over 1 MiB", func(t *testing.T) {
		before := keys(stored(east.op))
		fp.serve(now, strings.Repeat("#", signals.MaxAnswerBytes+10))
		poll()
		transport := counterValue(t, east.op, "grid_peer_poll_total", "peer", "west", "outcome", OutcomeTransport)
		after := keys(stored(east.op))
		sort.Strings(before)
		sort.Strings(after)
		if transport != 1 || !slices.Equal(before, after) {
			t.Errorf("an oversized answer: %v transport outcomes (want 1), store %v, was %v", transport, after, before)
		}
	})
}

func keys(m map[string][]signals.Row) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func entry(op *Operator, target string) *Entry {
	for _, e := range op.PeerStore().Current(time.Now()) {
		if e.Target == target {
			return e
		}
	}
	return nil
}

// TestHungPeerDoesNotHoldOthers: a peer that accepts and never answers ends
// its round inside the budget; the other peer publishes.
func TestHungPeerDoesNotHoldOthers(t *testing.T) {
	dir := pki(t, "east", "west", "south")
	hung := startFakePeer(t, dir, "south")
	release := make(chan struct{})
	defer close(release)
	hung.set(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			// The poller gave up: make sure nothing reaches it anyway.
			panic(http.ErrAbortHandler)
		}
	})
	good := startFakePeer(t, dir, "west")
	good.serve(time.Now(), batch("west", "a", time.Now().UnixMilli()-1000, 1, time.Now().UnixMilli()))
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "south=https://"+hung.addr, "west=https://"+good.addr)
	start := time.Now()
	east.op.PollPeers(context.Background())
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("round took %v with a 1.5s budget", d)
	}
	if entry(east.op, "west/a") == nil {
		t.Error("the good peer did not publish")
	}
	if v := counterValue(t, east.op, "grid_peer_poll_total", "peer", "south", "outcome", OutcomeTimeout); v != 1 {
		for _, o := range Outcomes {
			t.Logf("south %s: %v", o, counterValue(t, east.op, "grid_peer_poll_total", "peer", "south", "outcome", o))
		}
		t.Errorf("south timeouts %v", v)
	}
	if v := counterValue(t, east.op, "grid_peer_poll_retries_total", "peer", "south", "reason", OutcomeTimeout); v < 1 {
		t.Errorf("south retries %v", v)
	}
	// Past peerPoll.slow (1 s): the hung peer's poll counts as slow, the
	// good one's does not.
	if v := counterValue(t, east.op, "grid_peer_poll_slow_total", "peer", "south"); v != 1 {
		t.Errorf("south slow polls %v, want 1", v)
	}
	if v := counterValue(t, east.op, "grid_peer_poll_slow_total", "peer", "west"); v > 0 {
		t.Errorf("west slow polls %v, want none", v)
	}
}

// TestRestartedPeerIsAccepted: an operator restarted with its state keeps
// publishing a rising epoch, and its peer accepts the new batches.
func TestRestartedPeerIsAccepted(t *testing.T) {
	dir := pki(t, "east", "west")
	eastSim := startSim(t, sim.Options{Kind: sim.KindEPP})
	state := t.TempDir()
	prov := []config.Provider{providerConf("east-pool", "epp", eastSim.URL)}
	east := startSite(t, dir, "east", state, "", prov, "west=https://127.0.0.1:1")
	west := startSite(t, dir, "west", t.TempDir(), "", nil, "east=https://"+east.addr)
	east.op.Pass(context.Background())
	west.op.PollPeers(context.Background())
	first := entry(west.op, "east/east-pool")
	if first == nil || first.Batch == nil {
		t.Fatal("nothing from east")
	}
	addr := east.addr
	east.stop()
	east2 := startSite(t, dir, "east", state, addr, prov, "west=https://127.0.0.1:1")
	if east2.op.Epoch() <= east.op.Epoch() {
		t.Fatalf("epoch %d after restart, was %d", east2.op.Epoch(), east.op.Epoch())
	}
	east2.op.Pass(context.Background())
	west.op.PollPeers(context.Background())
	second := entry(west.op, "east/east-pool")
	if second == nil || second.Batch.Epoch != east2.op.Epoch() || second.Batch.Sequence != 1 {
		t.Fatalf("after restart west holds %+v", second.Batch)
	}
}

// TestIngestProperty: whatever a peer sends, what is stored is within the
// rules, and nothing panics.
func TestIngestProperty(t *testing.T) {
	dir := pki(t, "east", "west")
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1")
	ps := east.op.poller.snapshot()[0]
	rng := rand.New(rand.NewPCG(1, 2))
	names := append(append([]string{}, signals.ContractNames...), "go_goroutines", "x")
	sites := []string{"west", "west", "west", "east", "north", ""}
	values := []string{"0", "1", "0.5", "2", "-1", "NaN", "+Inf", "1e300", "7"}
	for iter := range 300 {
		now := time.Now()
		ms := now.UnixMilli()
		var b strings.Builder
		for range rng.IntN(200) {
			name := names[rng.IntN(len(names))]
			prov := fmt.Sprintf("p%d", rng.IntN(80))
			if rng.IntN(20) == 0 {
				prov = "Bad/Prov"
			}
			stamp := ms - int64(rng.IntN(3*86_400_000)) + int64(rng.IntN(5000))
			labels := fmt.Sprintf(`grid_provider=%q,grid_site=%q`, prov, sites[rng.IntN(len(sites))])
			if name == signals.ConfigGeneration {
				labels += fmt.Sprintf(`,batch_samples="1",batch_sequence="%d",provider_uid="u",publisher_epoch="%d"`, rng.IntN(1000), ms-int64(rng.IntN(2_000_000))+1_000_000)
			}
			fmt.Fprintf(&b, "%s{%s} %s %d\n", name, labels, values[rng.IntN(len(values))], stamp)
			if rng.IntN(30) == 0 {
				b.WriteString("garbage {{ line\n")
			}
		}
		east.op.poller.ingest(ps, []byte(b.String()), now)
		providers := map[string]bool{}
		for _, e := range east.op.PeerStore().Current(time.Now()) {
			if !strings.HasPrefix(e.Target, "west/") || e.CollectedAt.After(time.Now()) {
				t.Fatalf("iteration %d: entry %s at %v", iter, e.Target, e.CollectedAt)
			}
			for i := range e.Rows {
				r := &e.Rows[i]
				if reason, refused := signals.Check(r); refused {
					t.Fatalf("iteration %d: stored a row refused for %s: %+v", iter, reason, r)
				}
				if s, _ := r.Label(signals.LabelSite); s != "west" {
					t.Fatalf("iteration %d: stored a row of site %q", iter, s)
				}
				p, _ := r.Label(signals.LabelProvider)
				providers[p] = true
			}
		}
		if len(providers) > signals.MaxPeerProviders {
			t.Fatalf("iteration %d: %d providers stored", iter, len(providers))
		}
	}
}

func postReport(t *testing.T, from *identity.Source, addr string, rep signals.Report) (*http.Response, error) {
	t.Helper()
	conf, _ := from.ClientTLS("east")
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 3 * time.Second}
	defer c.CloseIdleConnections()
	body, _ := json.Marshal(rep)
	resp, err := c.Post("https://"+addr+signals.FeedbackPath, "application/json", strings.NewReader(string(body)))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// TestGatewayAgesRejected: the operator keeps each gateway replica's latest
// report; a bad one stands through silence, another replica's clean report
// and an operator restart, until the same replica reports clean.
func TestGatewayAgesRejected(t *testing.T) {
	dir := pki(t, "east", "west")
	state := t.TempDir()
	east := startSite(t, dir, "east", state, "", nil, "west=https://127.0.0.1:1")
	local, peer := idSource(t, dir, "east"), idSource(t, dir, "west")
	const a, b = "00000000000000000000000000000001", "00000000000000000000000000000002"
	bad := signals.Report{Epoch: a, Sequence: 2, SkewTotal: 3, Observed: signals.ObservedBad}

	// Only the site's own gateway may report.
	if resp, err := postReport(t, peer, east.addr, bad); err != nil || resp.StatusCode != 403 {
		t.Fatalf("a peer's report: %v %v", err, resp)
	}
	resp, err := postReport(t, local, east.addr, bad)
	if err != nil || resp.StatusCode != 204 || resp.Header.Get(signals.FeedbackEpochHeader) != a || resp.Header.Get(signals.FeedbackSequenceHeader) != "2" {
		t.Fatalf("bad report: %v %v", err, resp)
	}
	if got := east.op.GatewayAgesRejected(); len(got) != 1 {
		t.Fatalf("GatewayAgesRejected %v", got)
	}
	// Another replica's clean report does not clear a's evidence; an older
	// sequence of a is ignored.
	postReport(t, local, east.addr, signals.Report{Epoch: b, Sequence: 9, Observed: signals.ObservedClean})
	postReport(t, local, east.addr, signals.Report{Epoch: a, Sequence: 1, Observed: signals.ObservedClean})
	if got := east.op.GatewayAgesRejected(); len(got) != 1 {
		t.Fatalf("cleared by another replica or an old report: %v", got)
	}
	// An operator restart keeps it.
	addr := east.addr
	east.stop()
	east = startSite(t, dir, "east", state, addr, nil, "west=https://127.0.0.1:1")
	if got := east.op.GatewayAgesRejected(); len(got) != 1 {
		t.Fatalf("lost across a restart: %v", got)
	}
	if v := counterValue(t, east.op, "grid_gateway_ages_rejected"); v != 1 {
		t.Errorf("gauge %v", v)
	}
	// The same replica's clean report clears it.
	postReport(t, local, addr, signals.Report{Epoch: a, Sequence: 3, SkewTotal: 3, Observed: signals.ObservedClean})
	if got := east.op.GatewayAgesRejected(); len(got) != 0 {
		t.Fatalf("not cleared by a later clean report: %v", got)
	}
	// Malformed reports are refused with a message.
	conf, _ := local.ClientTLS("east")
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	defer c.CloseIdleConnections()
	r2, err := c.Post("https://"+addr+signals.FeedbackPath, "application/json", strings.NewReader(`{"process_epoch":"zz","observed":"bad","extra":1}`))
	if err != nil || r2.StatusCode != 400 {
		t.Fatalf("malformed report: %v %v", err, r2)
	}
	r2.Body.Close()
}

// TestPeerPollFailuresAreSaidOnce: a peer whose operator cannot be reached
// is said at WARN once, naming the peer and the outcome, not at every poll;
// once it answers again, one INFO says so.
func TestPeerPollFailuresAreSaidOnce(t *testing.T) {
	dir := pki(t, "east", "west")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	westAddr := ln.Addr().String()
	ln.Close() // west is down
	var logged syncBuffer
	log := slog.New(slog.NewJSONHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	east := startSiteTuned(t, siteTuning{log: log}, DefaultLimits, dir, "east", t.TempDir(), "", nil, "west=https://"+westAddr)
	count := func(level, msg string) int {
		n := 0
		for _, line := range strings.Split(logged.String(), "\n") {
			if strings.Contains(line, `"level":"`+level+`"`) && strings.Contains(line, msg) {
				n++
			}
		}
		return n
	}
	for range 3 {
		east.op.PollPeers(context.Background())
	}
	if n := count("WARN", "cannot poll peer"); n != 1 {
		t.Fatalf("three failed polls of a down peer logged %d WARNs, want 1:\n%s", n, logged.String())
	}
	if !strings.Contains(logged.String(), `"peer":"west"`) || !strings.Contains(logged.String(), `"outcome":"refused"`) {
		t.Errorf("the WARN does not name the peer and the outcome:\n%s", logged.String())
	}
	startSite(t, dir, "west", t.TempDir(), westAddr, nil, "east=https://"+east.addr)
	for range 2 {
		east.op.PollPeers(context.Background())
	}
	if n := count("INFO", "peer polled again"); n != 1 {
		t.Errorf("a peer back: %d INFOs, want 1:\n%s", n, logged.String())
	}
	if n := count("WARN", "cannot poll peer"); n != 1 {
		t.Errorf("WARNs after recovery: %d, want still 1", n)
	}
}

// syncBuffer is a bytes.Buffer a logger and a test may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
