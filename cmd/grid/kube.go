package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	gridv1 "github.com/grid-inference/grid/api/v1alpha1"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/kube"
	"github.com/grid-inference/grid/internal/operator"
)

// kubeFlags are the flags of `grid operator --kubernetes`.
type kubeFlags struct {
	enabled                      bool
	namespace, dataDir           string
	signalsListen, metricsListen string
}

// statusTimeout bounds one InferenceProvider status write.
const statusTimeout = 5 * time.Second

// runKubeOperator is the operator in Kubernetes mode: the configuration
// comes from the namespace's resources (internal/kube), the publisher epoch
// from a ConfigMap, and the operator itself is the file-mode one.
func runKubeOperator(ctx context.Context, k kubeFlags, drain time.Duration, e *env) error {
	if k.namespace == "" {
		return fmt.Errorf("%w: --kubernetes needs --namespace (or $POD_NAMESPACE)", errUsage)
	}
	log := e.log.With("component", "kubernetes", "namespace", k.namespace)
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := gridv1.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme: scheme,
		Cache:  cache.Options{DefaultNamespaces: map[string]cache.Config{k.namespace: {}}},
		// The operator serves its own /metrics; no second listener.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	tr := &kube.Translator{Reader: mgr.GetClient(), Secrets: mgr.GetAPIReader(), Namespace: k.namespace, Dir: k.dataDir,
		Base: config.Operator{Signals: config.Listener{Listen: k.signalsListen}, Metrics: config.Listener{Listen: k.metricsListen}}}
	var running atomic.Pointer[operator.Operator]
	ctl := &kube.Controller{Translator: tr, Log: log, Apply: func(cfg *config.Operator) error {
		op := running.Load()
		if op == nil {
			return nil // not started yet: the start reads the namespace itself
		}
		err := op.Reload(cfg)
		op.CountReload(err == nil)
		return err
	}}
	if err := ctl.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}

	mgrCtx, stopMgr := context.WithCancel(ctx)
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	defer func() { stopMgr(); <-mgrDone }()
	cfg, epoch, err := awaitSite(mgrCtx, mgr, restCfg, scheme, tr, k, log)
	if err != nil {
		return err
	}
	state, err := operator.NewObjectState(epoch, cfg.Providers)
	if err != nil {
		return err
	}
	return serveOperator(ctx, cfg, state, drain, e, func(ctx context.Context, op *operator.Operator) {
		running.Store(op)
		// A change between the first read and now is applied here.
		ctl.Reconcile(ctx, ctrl.Request{})
		statuses := &kube.StatusWriter{Client: mgr.GetClient(), Namespace: k.namespace, Verdicts: op.Verdicts, Timeout: statusTimeout, Now: time.Now}
		statuses.Run(ctx, cfg.ScrapeInterval.D(), log)
	})
}

// awaitSite waits until the namespace declares a site this operator can
// run, and reserves its publisher epoch. Meanwhile the metrics listener
// answers the kubelet's probes (kube.Startup): alive, not ready, and why.
func awaitSite(ctx context.Context, mgr ctrl.Manager, restCfg *rest.Config, scheme *runtime.Scheme, tr *kube.Translator, k kubeFlags, log *slog.Logger) (*config.Operator, int64, error) {
	startup := &kube.Startup{}
	ln, err := net.Listen("tcp", k.metricsListen)
	if err != nil {
		return nil, 0, fmt.Errorf("metrics listener: %w", err)
	}
	probes := &http.Server{Handler: startup.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go probes.Serve(ln)
	// Closed before the operator opens the same address for its own.
	defer probes.Close()

	startup.Set("the cache of namespace " + k.namespace + " is syncing")
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return nil, 0, fmt.Errorf("kubernetes: the cache of namespace %s did not sync", k.namespace)
	}
	cfg, err := tr.Wait(ctx, log, startup)
	if err != nil {
		return nil, 0, err
	}
	// The epoch is reserved through the API server directly, not the cache:
	// compare-and-swap needs the stored resourceVersion.
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, 0, fmt.Errorf("kubernetes: %w", err)
	}
	epoch, err := kube.ReserveEpoch(ctx, direct, k.namespace, cfg.Site, time.Now().UnixMilli())
	if err != nil {
		return nil, 0, err
	}
	return cfg, epoch, nil
}
