package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/membership"
	"github.com/grid-inference/grid/internal/operator"
	"golang.org/x/sync/errgroup"
)

func runOperator(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("operator", e)
	file := fs.String("config", "site.yaml", "operator configuration file")
	check := fs.Bool("check-config", false, "validate the configuration, load its certificates as a start would, and exit")
	checkIdentity := fs.Bool("check-identity", true, "with --check-config: also load and check the certificate files (off where they exist only elsewhere, e.g. in a pod)")
	drain := fs.Duration("drain-timeout", 10*time.Second, "how long in-flight requests get to finish on SIGTERM")
	resetEpoch := fs.Bool("reset-publisher-epoch", false, "start the publisher epoch from this host's clock when the one in stateDir is more than 10 minutes ahead of it (the clock was once ahead); see docs/reliability.md before using it")
	var k kubeFlags
	fs.BoolVar(&k.enabled, "kubernetes", false, "read the configuration from this namespace's GridNetwork, GridSites, InferenceProviders and Secrets instead of --config (docs/operations.md)")
	fs.StringVar(&k.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "with --kubernetes: the namespace to watch (default $POD_NAMESPACE)")
	fs.StringVar(&k.dataDir, "data-dir", "/var/run/grid", "with --kubernetes: where Secret keys and state are written (an emptyDir)")
	fs.StringVar(&k.signalsListen, "signals-listen", "0.0.0.0:9091", "with --kubernetes: the mTLS signals listener")
	fs.StringVar(&k.metricsListen, "metrics-listen", "0.0.0.0:9090", "with --kubernetes: the plain metrics listener")
	if err := parseFlags(e, fs, args); err != nil {
		return err
	}
	if k.enabled {
		return runKubeOperator(ctx, k, *drain, e)
	}
	cfg, err := config.LoadOperator(*file)
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
		fmt.Fprintf(e.stdout, "%s: valid operator configuration for site %q (%s, %s)%s\n", *file, cfg.Site,
			count(len(cfg.Providers), "provider"), count(len(cfg.Peers), "peer"), expiry)
		return nil
	}
	state, err := operator.OpenState(cfg.StateDir, time.Now().UnixMilli(), cfg.Providers, operator.OpenOptions{ResetEpoch: *resetEpoch})
	if err != nil {
		return err
	}
	return serveOperator(ctx, cfg, state, *drain, e, func(ctx context.Context, op *operator.Operator) {
		reloadOnHUP(ctx, *file, func() error {
			next, err := config.LoadOperator(*file)
			if err != nil {
				return err
			}
			warnDeprecated(e.log, next.Deprecated)
			return op.Reload(next)
		}, op.CountReload, e)
	})
}

// serveOperator runs an operator of cfg until ctx ends: its scrapes, its
// listeners, its peer polls and gossip, and reconfigure, which brings it
// configuration changes (SIGHUP in file mode, the namespace's resources in
// Kubernetes mode).
func serveOperator(ctx context.Context, cfg *config.Operator, state *operator.State, drain time.Duration, e *env,
	reconfigure func(context.Context, *operator.Operator)) error {
	log := e.log.With("component", "operator", "site", cfg.Site)
	clk := clock.Real{}
	var err error
	var id *identity.Source
	if cfg.TLS != nil {
		if id, err = identity.LoadSource(*cfg.TLS, cfg.TrustDomain, cfg.Site, clk, log); err != nil {
			return err
		}
	} else {
		log.Warn("no tls block: scraping and serving /metrics only; no signals are served and no peers polled (there is no plaintext signals path)")
	}
	op, err := operator.New(cfg, state, operator.Options{Clock: clk, Logger: log, Identity: id})
	if err != nil {
		return err
	}
	defer op.Close()
	ln, err := net.Listen("tcp", cfg.Metrics.Listen)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	var signalsLn net.Listener
	if id != nil {
		if signalsLn, err = net.Listen("tcp", cfg.Signals.Listen); err != nil {
			ln.Close()
			return fmt.Errorf("signals listener: %w", err)
		}
	}
	var cluster *membership.Cluster
	if cfg.Membership != nil {
		if cluster, err = startMembership(cfg, log); err != nil {
			ln.Close()
			signalsLn.Close()
			return err
		}
		log.Info("gossiping membership", "addr", cluster.Addr(), "seeds", cfg.Membership.Seeds)
	}
	srv, guarded := op.MetricsServer(ln, slog.NewLogLogger(log.Handler(), slog.LevelDebug))
	log.Info("operator started", "metrics", ln.Addr().String(), "providers", len(cfg.Providers), "peers", len(cfg.Peers), "publisher_epoch", op.Epoch())

	// The first task to fail ends them all; the operator returns once every
	// one has.
	tasks, runCtx := errgroup.WithContext(ctx)
	tasks.Go(func() error { op.Run(runCtx); return nil })
	tasks.Go(func() error { reconfigure(runCtx, op); return nil })
	if id != nil {
		log.Info("serving signals over mutual TLS", "addr", signalsLn.Addr().String(), "id", id.ID().String())
		tasks.Go(func() error { id.Run(runCtx, cfg.TLS.ReloadInterval.D()); return nil })
		tasks.Go(func() error { op.RunPeers(runCtx); return nil })
		if cluster != nil {
			tasks.Go(func() error {
				cluster.Run(runCtx, func(members []membership.Member) {
					peers := make([]config.Peer, len(members))
					for i, mb := range members {
						peers[i] = config.Peer{Site: mb.Site, Signals: mb.Signals, Gateway: mb.Gateway}
					}
					op.SetDiscovered(peers)
				})
				return nil
			})
		}
		tasks.Go(func() error { return op.ServeSignals(runCtx, signalsLn, operator.DefaultLimits, drain) })
	}
	tasks.Go(func() error { return serveUntilDone(runCtx, "metrics", srv, guarded, e, drain, nil) })
	return tasks.Wait()
}

// reloadOnHUP calls apply on every SIGHUP until ctx ends. apply re-reads
// and validates the whole file before changing anything, so a rejected
// reload changes nothing; each result is counted and logged.
func reloadOnHUP(ctx context.Context, file string, apply func() error, count func(applied bool), e *env) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		err := apply()
		count(err == nil)
		if err != nil {
			e.log.Error("configuration reload rejected; keeping the running configuration", "file", file, "err", err)
			continue
		}
		e.log.Info("configuration reloaded", "file", file)
	}
}

// startMembership joins the grid's gossip cluster as cfg.Membership says.
func startMembership(cfg *config.Operator, log *slog.Logger) (*membership.Cluster, error) {
	m := cfg.Membership
	key, err := membership.ReadKey(m.KeyFile)
	if err != nil {
		return nil, err
	}
	return membership.Start(membership.Config{Site: cfg.Site, Bind: m.Bind, Advertise: m.Advertise, Seeds: m.Seeds,
		Key: key, Signals: m.Signals, Gateway: m.Gateway, Profile: m.Profile, Logger: log.With("component", "membership")})
}

// count says "1 provider", "2 providers".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// loadIdentityNote loads the certificate material a configuration names, as
// the daemon would at start: the key matches the certificate, which names
// this site's SPIFFE id, chains to the grid CA and is valid now. It returns
// a note of when the certificate expires, for --check-config.
func loadIdentityNote(files *config.TLS, trustDomain, site string) (string, error) {
	if files == nil {
		return "; no tls block", nil
	}
	id, err := identity.LoadSource(*files, trustDomain, site, nil, nil)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("; certificate valid until %s", id.Expiry().UTC().Format(time.RFC3339)), nil
}

// warnDeprecated says, at WARN, each key a configuration wrote in an old
// spelling (config.Gateway.Deprecated): it was read, and the next release
// may not read it.
func warnDeprecated(log *slog.Logger, deprecated []string) {
	for _, d := range deprecated {
		log.Warn("deprecated configuration key: " + d)
	}
}
