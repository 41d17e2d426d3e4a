// Package demo runs a whole grid on one machine: simulated backends, an
// operator and a gateway per site with mutual TLS from a throw-away CA, a
// load generator, a scripted story, and a live view of what the gateways
// decide. Everything runs in this process, on loopback, and is torn down
// when the context ends.
package demo

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/gateway"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/operator"
	"github.com/grid-inference/grid/internal/sim"
)

// SiteSpec describes one demo site.
type SiteSpec struct {
	Name      string
	Kind      string // sim kind
	Endpoints int
	Slots     int
}

// DefaultSites are three sites of unequal capacity; the middle one runs
// SGLang engines, so the /v1/loads path is exercised too.
var DefaultSites = []SiteSpec{
	{Name: "east", Kind: sim.KindEPP, Endpoints: 2, Slots: 8},
	{Name: "central", Kind: sim.KindSGLang, Endpoints: 4, Slots: 8},
	{Name: "west", Kind: sim.KindEPP, Endpoints: 8, Slots: 8},
}

// Timing of the simulated engines: a request takes about TTFT + tokens×TPOT.
const (
	demoTTFT = 50 * time.Millisecond
	demoTPOT = 40 * time.Millisecond
)

// Site is a running demo site.
type Site struct {
	Spec     SiteSpec
	Sim      *sim.Sim
	SimURL   string
	Operator *operator.Operator
	Gateway  *gateway.Gateway
	// ClientURL is the gateway's OpenAI endpoint; MetricsURL its metrics.
	ClientURL, MetricsURL, OperatorMetricsURL string
}

// Slots is the site's total capacity.
func (s *Site) Slots() int { return s.Spec.Endpoints * s.Spec.Slots }

// Grid is the running system.
type Grid struct {
	Sites []*Site
	dir   string
	wg    sync.WaitGroup
	stops []func()
}

// quietLog drops net/http's own error lines (client disconnects during the
// story); the components log through slog.
var quietLog = log.New(io.Discard, "", 0)

// listen hands out loopback listeners, so every address is known before
// any configuration is written.
func listen() (net.Listener, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	return ln, ln.Addr().String(), nil
}

// Start builds and runs the grid. Cancel ctx and call Wait to tear it down.
func Start(ctx context.Context, specs []SiteSpec, log *slog.Logger) (*Grid, error) {
	dir, err := os.MkdirTemp("", "grid-demo-")
	if err != nil {
		return nil, err
	}
	g := &Grid{dir: dir}
	if err := g.start(ctx, specs, log); err != nil {
		g.stop()
		return nil, err
	}
	return g, nil
}

type addrs struct {
	simLn, sigLn, opMetLn, clientLn, hopLn, gwMetLn             net.Listener
	simAddr, sigAddr, opMetAddr, clientAddr, hopAddr, gwMetAddr string
}

func (g *Grid) start(ctx context.Context, specs []SiteSpec, log *slog.Logger) error {
	if err := identity.Init(g.dir, "grid.internal", time.Now()); err != nil {
		return err
	}
	all := make([]addrs, len(specs))
	for i, spec := range specs {
		if err := identity.Issue(g.dir, spec.Name, nil, time.Now()); err != nil {
			return err
		}
		a := &all[i]
		for _, p := range []struct {
			ln   *net.Listener
			addr *string
		}{{&a.simLn, &a.simAddr}, {&a.sigLn, &a.sigAddr}, {&a.opMetLn, &a.opMetAddr}, {&a.clientLn, &a.clientAddr}, {&a.hopLn, &a.hopAddr}, {&a.gwMetLn, &a.gwMetAddr}} {
			ln, addr, err := listen()
			if err != nil {
				return err
			}
			*p.ln, *p.addr = ln, addr
			g.stops = append(g.stops, func() { ln.Close() })
		}
	}
	for i, spec := range specs {
		site, err := g.startSite(ctx, specs, all, i, log.With("site", spec.Name))
		if err != nil {
			return fmt.Errorf("site %s: %w", spec.Name, err)
		}
		g.Sites = append(g.Sites, site)
	}
	return nil
}

func (g *Grid) serve(ctx context.Context, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: quietLog}
	g.wg.Add(2)
	go func() { defer g.wg.Done(); srv.Serve(ln) }()
	go func() {
		defer g.wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
}

func (g *Grid) run(f func()) {
	g.wg.Add(1)
	go func() { defer g.wg.Done(); f() }()
}

func (g *Grid) startSite(ctx context.Context, specs []SiteSpec, all []addrs, i int, log *slog.Logger) (*Site, error) {
	spec, a := specs[i], all[i]
	s := &Site{Spec: spec, SimURL: "http://" + a.simAddr, ClientURL: "http://" + a.clientAddr,
		MetricsURL: "http://" + a.gwMetAddr, OperatorMetricsURL: "http://" + a.opMetAddr}
	sm, err := sim.New(sim.Options{Kind: spec.Kind, Endpoints: spec.Endpoints, Slots: spec.Slots,
		TTFT: demoTTFT, TPOT: demoTPOT, Pool: spec.Name + "-pool", Logger: log})
	if err != nil {
		return nil, err
	}
	s.Sim = sm
	g.run(func() { sm.Run(ctx) })
	g.serve(ctx, a.simLn, sm.Handler())

	tlsBlock := fmt.Sprintf("tls: {ca: %q, cert: %q, key: %q}\n", filepath.Join(g.dir, "ca.crt"),
		filepath.Join(g.dir, spec.Name+".crt"), filepath.Join(g.dir, spec.Name+".key"))
	var peers strings.Builder
	for j, other := range all {
		if j != i {
			fmt.Fprintf(&peers, "  - {site: %s, signals: 'https://%s', gateway: 'https://%s'}\n", specs[j].Name, other.sigAddr, other.hopAddr)
		}
	}
	pool := ""
	if spec.Kind == sim.KindEPP {
		pool = ", poolName: " + spec.Name + "-pool"
	}
	opYAML := fmt.Sprintf("site: %s\n%sstateDir: %q\nsignals: {listen: %q}\nmetrics: {listen: %q}\npeerPollInterval: 1s\npeers:\n%sproviders:\n  - {name: %s-pool, model: %s, kind: %s, upstream: %q, metrics: {endpoint: %q%s}}\n",
		spec.Name, tlsBlock, filepath.Join(g.dir, "state-"+spec.Name), a.sigAddr, a.opMetAddr, peers.String(),
		spec.Name, sim.DefaultModel, spec.Kind, s.SimURL, s.SimURL, pool)
	if len(all) == 1 {
		opYAML = strings.Replace(opYAML, "peers:\n", "", 1)
	}
	opCfg, err := config.ParseOperator(spec.Name+" operator", []byte(opYAML))
	if err != nil {
		return nil, err
	}
	id, err := identity.LoadSource(*opCfg.TLS, opCfg.TrustDomain, spec.Name, nil, log)
	if err != nil {
		return nil, err
	}
	state, err := operator.OpenState(opCfg.StateDir, time.Now().UnixMilli(), opCfg.Providers, operator.OpenOptions{})
	if err != nil {
		return nil, err
	}
	op, err := operator.New(opCfg, state, operator.Options{Logger: log.With("component", "operator"), Identity: id})
	if err != nil {
		return nil, err
	}
	s.Operator = op
	g.stops = append(g.stops, op.Close)
	g.run(func() { op.Run(ctx) })
	g.run(func() { op.RunPeers(ctx) })
	g.run(func() { op.ServeSignals(ctx, a.sigLn, operator.DefaultLimits, time.Second) })
	g.serve(ctx, a.opMetLn, op.Handler())

	// Shedding after 2 s of every site full, not the default 5 s: the
	// demo's overload act shows shedding bound the queues, and a
	// demo-sized grid's queues grow by a hundred requests a second.
	gwYAML := fmt.Sprintf("site: %s\n%slisten: %q\nhop: {listen: %q}\nmetrics: {listen: %q}\noperator: {signals: 'https://%s'}\navailability: {shedding: true, full_after_ms: 2000}\n",
		spec.Name, tlsBlock, a.clientAddr, a.hopAddr, a.gwMetAddr, a.sigAddr)
	gwCfg, err := config.ParseGateway(spec.Name+" gateway", []byte(gwYAML))
	if err != nil {
		return nil, err
	}
	gw, err := gateway.New(gwCfg, gateway.Options{Logger: log.With("component", "gateway"), Identity: id})
	if err != nil {
		return nil, err
	}
	s.Gateway = gw
	g.stops = append(g.stops, gw.Close)
	g.run(func() { gw.Run(ctx) })
	g.serve(ctx, a.clientLn, gw.ClientHandler())
	g.serve(ctx, tls.NewListener(a.hopLn, gateway.HopTLS(id)), gw.HopHandler())
	g.serve(ctx, a.gwMetLn, gw.MetricsHandler())
	return s, nil
}

// Wait blocks until everything started has stopped, then removes the
// temporary directory.
func (g *Grid) Wait() {
	g.wg.Wait()
	g.stop()
}

func (g *Grid) stop() {
	for _, f := range g.stops {
		f()
	}
	os.RemoveAll(g.dir)
}
