package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/gateway"
	"github.com/grid-inference/grid/internal/identity"
	"golang.org/x/sync/errgroup"
)

func runGateway(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("gateway", e)
	file := fs.String("config", "gateway.yaml", "gateway configuration file")
	check := fs.Bool("check-config", false, "validate the configuration, load its certificates as a start would, and exit")
	checkIdentity := fs.Bool("check-identity", true, "with --check-config: also load and check the certificate files (off where they exist only elsewhere, e.g. in a pod)")
	drain := fs.Duration("drain-timeout", 30*time.Second, "how long in-flight requests and streams get to finish on SIGTERM")
	if err := parseFlags(e, fs, args); err != nil {
		return err
	}
	cfg, err := config.LoadGateway(*file)
	if err != nil {
		return err
	}
	warnDeprecated(e.log, cfg.Deprecated)
	if *check {
		expiry := "; certificates not checked"
		if *checkIdentity {
			if expiry, err = loadIdentityNote(cfg.TLS, cfg.TrustDomain, cfg.Site); err != nil {
				return err
			}
		}
		fmt.Fprintf(e.stdout, "%s: valid gateway configuration for site %q%s\n", *file, cfg.Site, expiry)
		return nil
	}
	log := e.log.With("component", "gateway", "site", cfg.Site)
	if limit := gateway.SetMemoryLimitFromCgroup(); limit > 0 {
		log.Info("memory limit set from the cgroup (GOMEMLIMIT not given)", "bytes", limit)
	} else if limit := gateway.SetMemoryLimitFromBodies(cfg.Limits.BodyBytes); limit > 0 {
		log.Info("memory limit set from the body budget (no GOMEMLIMIT, no cgroup limit)", "bytes", limit)
	}
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

	addrs := map[gateway.Listener]string{gateway.ClientListener: cfg.Listen, gateway.HopListener: cfg.Hop.Listen, gateway.MetricsListener: cfg.Metrics.Listen}
	listeners := map[gateway.Listener]net.Listener{}
	for _, name := range gateway.Listeners {
		ln, err := gateway.Listen(ctx, addrs[name], cfg.ReusePort)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("%s listener: %w", name, err)
		}
		// Connection caps apply at accept, before the hop's TLS handshake.
		var conf *tls.Config
		if name == gateway.HopListener {
			conf = gateway.HopTLS(id)
		}
		listeners[name] = gw.Guard(name, ln, conf)
	}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	servers := map[gateway.Listener]*http.Server{}
	for _, name := range gateway.Listeners {
		servers[name] = gw.Server(name, errLog)
	}
	log.Info("gateway started", "client", listeners[gateway.ClientListener].Addr().String(), "hop", listeners[gateway.HopListener].Addr().String(),
		"metrics", listeners[gateway.MetricsListener].Addr().String(), "operator", cfg.Operator.Signals)

	tasks, runCtx := errgroup.WithContext(ctx)
	tasks.Go(func() error { gw.Run(runCtx); return nil })
	tasks.Go(func() error { id.Run(runCtx, cfg.TLS.ReloadInterval.D()); return nil })
	tasks.Go(func() error {
		reloadOnHUP(runCtx, *file, func() error {
			next, err := config.LoadGateway(*file)
			if err != nil {
				return err
			}
			warnDeprecated(log, next.Deprecated)
			return gw.Reload(next)
		}, gw.CountReload, e)
		return nil
	})
	for name, srv := range servers {
		var more []func(context.Context) error
		var lameDuck func(context.Context)
		switch name {
		case gateway.ClientListener:
			lameDuck = gw.QuietClients
			more = append(more, gw.DrainStreams) // streams the server handed off, and its own
		case gateway.HopListener:
			more = append(more, gw.InterruptStreams) // the streams it copies, past the deadline
		}
		tasks.Go(func() error {
			return serveUntilDone(runCtx, name.String(), srv, listeners[name], e, *drain, lameDuck, more...)
		})
	}
	return tasks.Wait()
}
