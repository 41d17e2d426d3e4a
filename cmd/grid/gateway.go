package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/gateway"
	"github.com/grid-inference/grid/internal/identity"
)

func runGateway(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("gateway", e)
	file := fs.String("config", "gateway.yaml", "gateway configuration file")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	drain := fs.Duration("drain-timeout", 30*time.Second, "how long in-flight requests and streams get to finish on SIGTERM")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.LoadGateway(*file)
	if err != nil {
		return err
	}
	if *check {
		fmt.Fprintf(e.stdout, "%s: valid gateway configuration for site %q\n", *file, cfg.Site)
		return nil
	}
	log := e.log.With("component", "gateway", "site", cfg.Site)
	clk := clock.Real{}
	id, err := identity.LoadSource(*cfg.TLS, cfg.TrustDomain, cfg.Site, clk, log)
	if err != nil {
		return err
	}
	gw, err := gateway.New(cfg, gateway.Options{Clock: clk, Logger: log, Identity: id})
	if err != nil {
		return err
	}
	defer gw.Close()

	listeners := map[string]net.Listener{}
	for name, addr := range map[string]string{"client": cfg.Listen, "hop": cfg.Hop.Listen, "metrics": cfg.Metrics.Listen} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("%s listener: %w", name, err)
		}
		listeners[name] = ln
	}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	servers := map[string]*http.Server{}
	for _, name := range []string{"client", "hop", "metrics"} {
		servers[name] = gw.Server(name, errLog)
	}
	// Connection caps apply at accept, before the hop's TLS handshake.
	listeners["client"] = gw.Guard("client", listeners["client"])
	listeners["metrics"] = gw.Guard("metrics", listeners["metrics"])
	listeners["hop"] = tls.NewListener(gw.Guard("hop", listeners["hop"]), id.ServerTLS())
	log.Info("gateway started", "client", listeners["client"].Addr().String(), "hop", listeners["hop"].Addr().String(),
		"metrics", listeners["metrics"].Addr().String(), "operator", cfg.Operator.Signals)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	goRun := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	goRun(func() { gw.Run(runCtx) })
	goRun(func() { id.Run(runCtx, cfg.TLS.ReloadInterval.D()) })
	goRun(func() {
		reloadOnHUP(runCtx, *file, func() error {
			next, err := config.LoadGateway(*file)
			if err != nil {
				return err
			}
			return gw.Reload(next)
		}, gw.CountReload, e)
	})
	errs := make(chan error, len(servers))
	for name, srv := range servers {
		goRun(func() { errs <- serveUntilDone(runCtx, srv, listeners[name], e, *drain) })
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errs:
	}
	cancel()
	wg.Wait()
	return first
}
