package operator

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/membership"
)

// gossipDial resolves the test's advertised names, <site>.grid.test, to
// loopback: an advertised loopback address is refused (peeraddr.Check), so
// the members advertise names, as they would in production, and the test
// plays the resolver.
func gossipDial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err == nil && strings.HasSuffix(host, ".grid.test") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// gossipSite is one operator of the membership test: an operator serving
// signals and polling peers, and its member of the gossip cluster.
type gossipSite struct {
	name       string
	op         *Operator
	signals    string // advertised URL
	gossipAddr string
	stopMember func()
}

func startGossipSite(t *testing.T, dir, name string, key []byte, bind string, seeds []string) *gossipSite {
	t.Helper()
	cfg := reparse(t, &config.Operator{Site: name, StateDir: t.TempDir(), TLS: tlsFiles(dir, name)})
	cfg.PeerPoll.Timeout = config.Duration(500 * time.Millisecond)
	cfg.PeerPoll.Budget = config.Duration(1500 * time.Millisecond)
	state, err := OpenState(cfg.StateDir, time.Now().UnixMilli(), nil, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op, err := New(cfg, state, Options{Clock: clock.Real{}, Identity: idSource(t, dir, name), Dial: gossipDial})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	served, polled := make(chan struct{}), make(chan struct{})
	go func() { op.ServeSignals(ctx, ln, DefaultLimits, time.Second); close(served) }()
	go func() { op.RunPeers(ctx); close(polled) }()
	t.Cleanup(func() { cancel(); <-served; <-polled; op.Close() })

	s := &gossipSite{name: name, op: op, signals: fmt.Sprintf("https://%s.grid.test:%s", name, port)}
	s.join(t, key, bind, seeds)
	return s
}

// join starts the site's gossip member; stopMember kills it without a
// leave message, as a crashed process would.
func (s *gossipSite) join(t *testing.T, key []byte, bind string, seeds []string) {
	t.Helper()
	c, err := membership.Start(membership.Config{Site: s.name, Bind: bind, Seeds: seeds, Key: key,
		Signals: s.signals, Profile: "local", RejoinInterval: 200 * time.Millisecond, SkipLeave: true})
	if err != nil {
		t.Fatal(err)
	}
	s.gossipAddr = c.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		c.Run(ctx, func(ms []membership.Member) {
			peers := make([]config.Peer, len(ms))
			for i, m := range ms {
				peers[i] = config.Peer{Site: m.Site, Signals: m.Signals}
			}
			s.op.SetDiscovered(peers)
		})
		close(done)
	}()
	stopped := false
	s.stopMember = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(s.stopMember)
}

// polling lists the peers the site polls.
func (s *gossipSite) polling() []string {
	var out []string
	for _, ps := range s.op.poller.snapshot() {
		out = append(out, ps.cfg.Site)
	}
	return out
}

// upFor reports whether the site's latest poll of peer succeeded.
func (s *gossipSite) upFor(peer string) bool {
	return testutil.ToFloat64(s.op.m.peers.up.WithLabelValues(peer)) == 1
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > within {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestMembershipDiscoversPeers runs three operators on loopback that know
// no peer, only a gossip seed: they find each other and poll each other
// over mutual TLS; a killed member leaves the others' poll sets once SWIM
// declares it dead, and comes back when restarted.
func TestMembershipDiscoversPeers(t *testing.T) {
	dir := pki(t, "s1", "s2", "s3")
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	s1 := startGossipSite(t, dir, "s1", key, "127.0.0.1:0", nil)
	s2 := startGossipSite(t, dir, "s2", key, "127.0.0.1:0", []string{s1.gossipAddr})
	s3 := startGossipSite(t, dir, "s3", key, "127.0.0.1:0", []string{s1.gossipAddr})
	sites := []*gossipSite{s1, s2, s3}

	took := waitFor(t, 10*time.Second, "every site polls the other two", func() bool {
		for _, s := range sites {
			for _, o := range sites {
				if o != s && (!slices.Contains(s.polling(), o.name) || !s.upFor(o.name)) {
					return false
				}
			}
		}
		return true
	})
	t.Logf("discovered and polled over mTLS in %v", took)

	s2Addr := s2.gossipAddr
	s2.stopMember()
	took = waitFor(t, 20*time.Second, "s2 leaves the poll sets of s1 and s3", func() bool {
		return !slices.Contains(s1.polling(), "s2") && !slices.Contains(s3.polling(), "s2")
	})
	t.Logf("a killed member left the poll sets in %v", took)

	s2.join(t, key, s2Addr, []string{s1.gossipAddr})
	took = waitFor(t, 15*time.Second, "s2 rejoins and is polled again", func() bool {
		return slices.Contains(s1.polling(), "s2") && slices.Contains(s3.polling(), "s2") && s1.upFor("s2") && s3.upFor("s2")
	})
	t.Logf("a restarted member was polled again in %v", took)
}

// TestMembershipGossipIsOnlyAClaim: a member that advertises another
// site's signals address under its own name is polled, and refused by the
// SPIFFE check, since the certificate there names the other site.
func TestMembershipGossipIsOnlyAClaim(t *testing.T) {
	dir := pki(t, "s1", "s2", "liar")
	key := []byte("0123456789abcdef0123456789abcdef")
	s1 := startGossipSite(t, dir, "s1", key, "127.0.0.1:0", nil)
	s2 := startGossipSite(t, dir, "s2", key, "127.0.0.1:0", []string{s1.gossipAddr})
	liar, err := membership.Start(membership.Config{Site: "liar", Bind: "127.0.0.1:0", Seeds: []string{s1.gossipAddr},
		Key: key, Signals: s2.signals, Profile: "local"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { liar.Run(ctx, func([]membership.Member) {}); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, 10*time.Second, "s1 polls the liar and s2", func() bool {
		p := s1.polling()
		return slices.Contains(p, "liar") && slices.Contains(p, "s2") && s1.upFor("s2")
	})
	waitFor(t, 10*time.Second, "s1's poll of the liar fails on TLS", func() bool {
		return testutil.ToFloat64(s1.op.m.peers.polls.WithLabelValues("liar", OutcomeTLS)) > 0
	})
	if s1.upFor("liar") {
		t.Error("the liar's poll succeeded: a gossiped address was believed without the certificate")
	}
}

// TestMembershipWrongKeyIsNotAMember: a member with another gossip key
// never joins, while one with the right key, started after it with the
// same seed, does (the control: the wrong key, not too short a wait, keeps
// it out).
func TestMembershipWrongKeyIsNotAMember(t *testing.T) {
	dir := pki(t, "s1", "s2", "s3")
	key := []byte("0123456789abcdef")
	s1 := startGossipSite(t, dir, "s1", key, "127.0.0.1:0", nil)
	s2 := startGossipSite(t, dir, "s2", []byte("fedcba9876543210"), "127.0.0.1:0", []string{s1.gossipAddr})
	s3 := startGossipSite(t, dir, "s3", key, "127.0.0.1:0", []string{s1.gossipAddr})
	waitFor(t, 10*time.Second, "s3, with the right key, is polled by s1 and polls it", func() bool {
		return slices.Contains(s1.polling(), "s3") && slices.Contains(s3.polling(), "s1")
	})
	if p := s1.polling(); slices.Contains(p, "s2") {
		t.Errorf("s1 polls %v: a member with another key got in", p)
	}
	if p := s2.polling(); len(p) != 0 {
		t.Errorf("s2 polls %v through a cluster it could not join", p)
	}
}

func TestGossipKeyFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gossip.key")
	if err := membership.WriteKey(file); err != nil {
		t.Fatal(err)
	}
	if err := membership.WriteKey(file); err == nil {
		t.Error("a second WriteKey replaced the key every member shares")
	}
	key, err := membership.ReadKey(file)
	if err != nil || len(key) != 32 {
		t.Fatalf("ReadKey: %d bytes, %v", len(key), err)
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	for name, body := range map[string]string{"short": base64.StdEncoding.EncodeToString(make([]byte, 8)), "text": "not base64!"} {
		f := filepath.Join(dir, name)
		os.WriteFile(f, []byte(body), 0o600)
		if _, err := membership.ReadKey(f); err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("%s key: %v, want an error naming the file", name, err)
		}
	}
}

// TestDiscoveredPeersJoinTheConfigured: gossip adds poll targets; it never
// replaces a configured peer's addresses, and gossip naming this site is
// ignored.
func TestDiscoveredPeersJoinTheConfigured(t *testing.T) {
	op := newPeeringOperator(t, "east", "west")
	op.SetDiscovered([]config.Peer{
		{Site: "west", Signals: "https://evil.example:1", Gateway: "https://evil.example:2"},
		{Site: "east", Signals: "https://east.example:1"},
		{Site: "north", Signals: "https://north.example:9091", Gateway: "https://north.example:8081"},
	})
	got := op.peers()
	want := []config.Peer{{Site: "west", Signals: "https://127.0.0.1:1"}, {Site: "north", Signals: "https://north.example:9091", Gateway: "https://north.example:8081"}}
	if !slices.EqualFunc(got, want, config.Peer.Equal) {
		t.Errorf("peers %v, want %v", got, want)
	}
	if p := op.poller.snapshot(); len(p) != 2 || p[0].cfg.Site != "north" || p[1].cfg.Site != "west" {
		t.Errorf("polling %v", p)
	}
	if !op.isPeer("north") || op.isPeer("south") {
		t.Error("a discovered member is not served as a peer, or a stranger is")
	}
	op.SetDiscovered(nil)
	if p := op.poller.snapshot(); len(p) != 1 || p[0].cfg.Site != "west" {
		t.Errorf("after the member left, polling %v", p)
	}
}
