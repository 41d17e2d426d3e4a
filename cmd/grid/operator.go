package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/operator"
)

func runOperator(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("operator", e)
	file := fs.String("config", "site.yaml", "operator configuration file")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	drain := fs.Duration("drain-timeout", 10*time.Second, "how long in-flight requests get to finish on SIGTERM")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.LoadOperator(*file)
	if err != nil {
		return err
	}
	if *check {
		fmt.Fprintf(e.stdout, "%s: valid operator configuration for site %q (%d providers, %d peers)\n", *file, cfg.Site, len(cfg.Providers), len(cfg.Peers))
		return nil
	}
	log := e.log.With("component", "operator", "site", cfg.Site)
	clk := clock.Real{}
	state, err := operator.OpenState(cfg.StateDir, clk.Now().UnixMilli(), cfg.Providers)
	if err != nil {
		return err
	}
	op := operator.New(cfg, state, operator.Options{Clock: clk, Logger: log})
	if cfg.TLS == nil {
		log.Warn("no tls block: scraping and serving /metrics only; no signals are served and no peers polled (there is no plaintext signals path)")
	}
	ln, err := net.Listen("tcp", cfg.Metrics.Listen)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	srv := &http.Server{Handler: op.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	log.Info("operator started", "metrics", ln.Addr().String(), "providers", len(cfg.Providers), "publisher_epoch", op.Epoch())

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); op.Run(runCtx) }()
	go reloadOnHUP(runCtx, *file, op, e)

	err = serveUntilDone(ctx, srv, ln, e, *drain)
	cancel()
	<-done
	return err
}

// reloadOnHUP re-reads the configuration on SIGHUP. The file is validated
// whole first; a rejected reload changes nothing and is logged and counted.
func reloadOnHUP(ctx context.Context, file string, op *operator.Operator, e *env) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		next, err := config.LoadOperator(file)
		if err == nil {
			err = op.Reload(next)
		}
		op.CountReload(err == nil)
		if err != nil {
			e.log.Error("configuration reload rejected; keeping the running configuration", "file", file, "err", err)
			continue
		}
		e.log.Info("configuration reloaded", "file", file, "providers", len(next.Providers))
	}
}
