package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/grid-inference/grid/internal/gateway"
	"github.com/grid-inference/grid/internal/sim"
)

func runSim(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("sim", e)
	var o sim.Options
	listen := fs.String("listen", "127.0.0.1:9000", "address to serve on")
	fs.StringVar(&o.Kind, "kind", sim.KindEPP, "backend to simulate: epp, vllm or sglang")
	fs.StringVar(&o.Model, "model", sim.DefaultModel, "model name served")
	fs.StringVar(&o.Pool, "pool", "", "EPP pool name (label `name`); default derived from the model, e.g. qwen3-8b-pool")
	fs.IntVar(&o.Endpoints, "endpoints", 1, "engines: EPP endpoints, or data-parallel engines behind one vLLM/SGLang server")
	fs.IntVar(&o.Slots, "slots", 8, "requests one engine runs at once; the rest queue")
	fs.DurationVar(&o.TTFT, "ttft", 50*time.Millisecond, "prefill time once a request has a slot")
	fs.DurationVar(&o.TPOT, "tpot", 10*time.Millisecond, "time per output token")
	fs.DurationVar(&o.PrefillPerToken, "prefill-per-token", 0, "prefill time of each prompt token the prefix cache does not hold, on top of --ttft")
	fs.BoolVar(&o.SharedPrefill, "shared-prefill", false, "each engine prefills one prompt at a time, in the order requests got their slots, as an engine's compute is one")
	fs.IntVar(&o.PrefixCacheTokens, "prefix-cache-tokens", 0, "each engine's prefix cache, in tokens (blocks of 16, least recently used evicted); 0 is none")
	fs.BoolVar(&o.LegacyLoads, "legacy-loads", false, "sglang: answer /v1/loads in the pre-May-2026 shape (dp_rank_count, aggregate)")
	fs.StringVar(&o.MetricsToken, "metrics-token", "", "require Authorization: Bearer TOKEN on /metrics, as the EPP does by default")
	fs.BoolVar(&o.FlowControl, "flow-control", false, "epp: hold requests in the EPP while every endpoint is busy, and export flow-control series")
	fs.DurationVar(&o.RefreshInterval, "refresh-interval", time.Second, "epp: how often pool gauges are recomputed (the real EPP uses 5s)")
	if err := parseFlags(e, fs, args); err != nil {
		return err
	}
	o.Logger = e.log.With("component", "sim", "kind", o.Kind)
	s, err := sim.New(o)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.Run(runCtx)
	e.log.Info("sim serving", "kind", o.Kind, "addr", ln.Addr().String(), "model", o.Model, "endpoints", o.Endpoints, "slots", o.Slots)
	return serveUntilDone(ctx, "sim", srv, ln, e, 10*time.Second, nil)
}

// serveUntilDone serves until ctx ends, then drains: new connections are
// refused, in-flight requests get up to drain to finish, and so does each
// of more, run after the server's own drain under the same deadline (the
// gateway's detached streams, which the server does not track).
//
// With lameDuck set (the gateway's client listener), the drain begins
// with it, under the drain's deadline: it stops the listener taking
// connections (a replacement bound with SO_REUSEPORT takes them), tells
// the clients on kept-alive connections to go, and returns once they have
// been told (gateway.QuietClients); only then are the idle connections
// closed. Closed at once, an idle connection races the request its client
// is writing on it, which fails.
func serveUntilDone(ctx context.Context, name string, srv *http.Server, ln net.Listener, e *env, drain time.Duration, lameDuck func(context.Context), more ...func(context.Context) error) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s listener: %w", name, err)
	case <-ctx.Done():
	}
	e.log.Info("draining", "listener", name, "timeout", drain)
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if lameDuck != nil {
		lameDuck(sctx)
	}
	// Every drain runs, even past the deadline: a drain given a context
	// already done ends what it holds at once, its own way (the gateway's
	// detached streams with their terminal event).
	err := srv.Shutdown(sctx)
	for _, drainMore := range more {
		err = errors.Join(err, drainMore(sctx))
	}
	if err != nil {
		// The drains past their deadline interrupted what they hold; the
		// handlers get the gateway's grace to end their answers (its
		// streams write their terminal event) before the connections
		// close.
		gctx, gcancel := context.WithTimeout(context.Background(), gateway.DrainGrace)
		srv.Shutdown(gctx)
		gcancel()
		srv.Close()
		e.log.Warn("drain timed out; closed remaining connections", "listener", name, "err", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
