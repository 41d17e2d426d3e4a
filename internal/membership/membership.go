// Package membership finds a grid's operators with SWIM gossip
// (hashicorp/memberlist). Each operator joins one encrypted memberlist
// cluster under its site name and advertises, in its node metadata, where
// its signals listener and its gateway's hop listener are. The members
// alive become poll targets. Gossip proves membership only: every poll still
// verifies the peer's certificate and that its SPIFFE id names the site, and
// an advertised address that would aim the poller at its own host or at a
// metadata service is refused (peeraddr.Check).
package membership

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/grid-inference/grid/internal/peeraddr"
)

// Config is one operator's membership.
type Config struct {
	// Site is this operator's site, its node name in the cluster.
	Site string
	// Bind is the gossip listener, host:port (UDP and TCP).
	Bind string
	// Advertise is the host:port other members reach this one at; empty
	// lets memberlist choose from Bind.
	Advertise string
	// Seeds are members to join through, host:port.
	Seeds []string
	// Key encrypts and authenticates gossip (16, 24 or 32 bytes, AES).
	Key []byte
	// Signals and Gateway are the URLs this site advertises.
	Signals, Gateway string
	// Profile is memberlist's timing preset: "lan" (the default: probe
	// every second, a dead member declared within about five), "wan" (for
	// members across the internet: slower probes, longer suspicion) or
	// "local" (loopback, for tests and the demo).
	Profile string
	// RejoinInterval is how often, while this member knows no other, it
	// tries its seeds again.
	RejoinInterval time.Duration
	// SkipLeave stops without the leave broadcast, so the others find out
	// by failure detection, as after a crash (tests of that path).
	SkipLeave bool
	Logger    *slog.Logger
}

// Member is a site found through gossip, with the addresses it advertises.
type Member struct {
	Site    string
	Signals string
	Gateway string
}

// metadata is what a member gossips about itself, bounded by memberlist's
// 512-byte metadata limit.
type metadata struct {
	Version int    `json:"v"`
	Site    string `json:"site"`
	Signals string `json:"signals"`
	Gateway string `json:"gateway,omitempty"`
}

// ReadKey reads a gossip key file: the base64 of 16, 24 or 32 random bytes
// (`grid certs gossip-key` writes one).
func ReadKey(file string) ([]byte, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("gossip key %s: not base64: %w", file, err)
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("gossip key %s: %d bytes, want 16, 24 or 32", file, len(key))
}

// WriteKey writes a new random 32-byte gossip key to file (mode 0600),
// refusing to replace one: every member of a cluster needs the same key.
func WriteKey(file string) error {
	key := make([]byte, 32)
	rand.Read(key)
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("gossip key: %w", err)
	}
	if _, err := f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("gossip key: %w", err)
	}
	return f.Close()
}

// Cluster is this operator's membership in the grid's gossip cluster.
type Cluster struct {
	cfg     Config
	ml      *memberlist.Memberlist
	log     *slog.Logger
	changed chan struct{}

	mu     sync.Mutex
	warned map[string]bool // "site endpoint" refusals already logged
}

// Start creates this member and begins gossiping; it does not wait for the
// seeds (Run keeps trying them).
func Start(cfg Config) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Key) == 0 {
		return nil, ErrNoKey
	}
	if cfg.RejoinInterval <= 0 {
		cfg.RejoinInterval = 5 * time.Second
	}
	meta, err := json.Marshal(metadata{Version: 1, Site: cfg.Site, Signals: cfg.Signals, Gateway: cfg.Gateway})
	if err != nil {
		return nil, err
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("membership: advertised addresses take %d bytes of metadata, the limit is %d", len(meta), memberlist.MetaMaxSize)
	}
	var mc *memberlist.Config
	switch cfg.Profile {
	case "", "lan":
		mc = memberlist.DefaultLANConfig()
	case "wan":
		mc = memberlist.DefaultWANConfig()
	case "local":
		mc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("membership: profile %q is not one of lan, wan, local", cfg.Profile)
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, changed: make(chan struct{}, 1), warned: map[string]bool{}}
	mc.Name = cfg.Site
	if mc.BindAddr, mc.BindPort, err = hostPort(cfg.Bind); err != nil {
		return nil, fmt.Errorf("membership bind: %w", err)
	}
	if cfg.Advertise != "" {
		if mc.AdvertiseAddr, mc.AdvertisePort, err = hostPort(cfg.Advertise); err != nil {
			return nil, fmt.Errorf("membership advertise: %w", err)
		}
	}
	mc.SecretKey = cfg.Key
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	mc.Delegate = &delegate{meta: meta}
	mc.Events = &events{c: c}
	mc.Conflict = &conflicts{c: c}
	mc.Logger = log.New(&logWriter{log: c.log}, "", 0)
	if c.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	return c, nil
}

func hostPort(s string) (string, int, error) {
	host, portText, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", s)
	}
	return host, port, nil
}

// Addr is where this member gossips, host:port.
func (c *Cluster) Addr() string {
	n := c.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Run joins the seeds, retrying while this member knows no other, and
// calls update with the members alive whenever membership changes, until
// ctx ends; then it leaves the cluster (so the others drop this site at
// once, not after a suspicion timeout) and shuts down.
func (c *Cluster) Run(ctx context.Context, update func([]Member)) {
	defer c.shutdown()
	c.join()
	update(c.Members())
	tick := time.NewTicker(c.cfg.RejoinInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.changed:
			update(c.Members())
		case <-tick.C:
			if c.ml.NumMembers() <= 1 {
				c.join()
			}
			// Metadata refusals are re-read, and a missed event repaired.
			update(c.Members())
		}
	}
}

func (c *Cluster) join() {
	if len(c.cfg.Seeds) == 0 {
		return
	}
	if n, err := c.ml.Join(c.cfg.Seeds); err != nil {
		c.log.Warn("membership: no seed answered; retrying", "seeds", c.cfg.Seeds, "err", err)
	} else {
		c.log.Info("membership: joined", "contacted", n, "members", c.ml.NumMembers())
	}
}

func (c *Cluster) shutdown() {
	if !c.cfg.SkipLeave {
		if err := c.ml.Leave(2 * time.Second); err != nil {
			c.log.Debug("membership: leave", "err", err)
		}
	}
	c.ml.Shutdown()
}

// Members lists the other members alive (or suspected, not yet declared
// dead) whose metadata is valid, sorted by site. A member advertising an
// address that must not be dialled is left out and warned about once per
// site and address; the set of warnings is cleared at 1024 entries.
func (c *Cluster) Members() []Member {
	var out []Member
	for _, n := range c.ml.Members() {
		if n.Name == c.cfg.Site {
			continue
		}
		m, err := parseMeta(n.Name, n.Meta)
		if err != nil {
			c.warnOnce(n.Name+" "+string(n.Meta), "membership: member refused", "member", n.Name, "err", err)
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Site, b.Site) })
	return out
}

// parseMeta reads a member's metadata and checks it: the site it claims is
// its node name, and its addresses may be dialled.
func parseMeta(node string, raw []byte) (Member, error) {
	var md metadata
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&md); err != nil {
		return Member{}, fmt.Errorf("metadata: %w", err)
	}
	if md.Version != 1 {
		return Member{}, fmt.Errorf("metadata version %d, want 1", md.Version)
	}
	if md.Site != node {
		return Member{}, fmt.Errorf("metadata names site %q, the node is %q", md.Site, node)
	}
	if err := peeraddr.Check(md.Signals); err != nil {
		return Member{}, fmt.Errorf("signals address: %w", err)
	}
	if md.Gateway != "" {
		if err := peeraddr.Check(md.Gateway); err != nil {
			return Member{}, fmt.Errorf("gateway address: %w", err)
		}
	}
	return Member{Site: md.Site, Signals: md.Signals, Gateway: md.Gateway}, nil
}

func (c *Cluster) warnOnce(key, msg string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.warned[key] {
		return
	}
	if len(c.warned) >= 1024 {
		clear(c.warned)
	}
	c.warned[key] = true
	c.log.Warn(msg, args...)
}

func (c *Cluster) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// delegate gossips this member's metadata; Grid sends no user messages.
type delegate struct{ meta []byte }

func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// events turns memberlist's membership events into a change signal.
type events struct{ c *Cluster }

func (e *events) NotifyJoin(n *memberlist.Node) {
	e.c.log.Info("membership: member joined", "member", n.Name, "addr", n.Address())
	e.c.notify()
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	e.c.log.Info("membership: member left or was declared dead", "member", n.Name)
	e.c.notify()
}

func (e *events) NotifyUpdate(n *memberlist.Node) { e.c.notify() }

// conflicts logs two members claiming one site: memberlist keeps the first,
// and the poll's SPIFFE check keeps the impostor from being believed.
type conflicts struct{ c *Cluster }

func (x *conflicts) NotifyConflict(existing, other *memberlist.Node) {
	x.c.warnOnce("conflict "+other.Address(), "membership: two members claim one site", "site", existing.Name,
		"existing", existing.Address(), "other", other.Address())
}

// logWriter passes memberlist's log lines to slog at their level.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	switch {
	case strings.HasPrefix(line, "[ERR]"):
		level = slog.LevelError
	case strings.HasPrefix(line, "[WARN]"):
		level = slog.LevelWarn
	}
	w.log.Log(context.Background(), level, line, "component", "memberlist")
	return len(p), nil
}

// ErrNoKey refuses a cluster without a gossip key: members found through
// unauthenticated gossip would be polled on anyone's say-so.
var ErrNoKey = errors.New("membership: a gossip key is required")
