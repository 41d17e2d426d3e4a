package kube

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gridv1 "github.com/grid-inference/grid/api/v1alpha1"
	"github.com/grid-inference/grid/internal/config"
)

// resyncInterval re-reads the namespace even without events, so a missed
// or failed application heals.
const resyncInterval = 30 * time.Second

// Controller keeps the operator's configuration in step with its
// namespace's Grid resources and the Secrets they reference (re-read at
// every reconcile, at least every resyncInterval: they are not watched, see
// Translator.Secrets). Every change is one reconcile of the whole namespace
// (it is one configuration), translated and applied as a file-mode reload
// would be, validated whole first, so a rejected change alters nothing.
type Controller struct {
	Translator *Translator
	// Apply installs a new configuration (the operator's Reload, counted).
	Apply func(*config.Operator) error
	Log   *slog.Logger
}

// Reconcile translates the namespace and applies the result.
func (c *Controller) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	cfg, err := c.Translator.Config(ctx)
	switch {
	case errors.Is(err, ErrNoNetwork):
		c.Log.Warn("waiting for a GridNetwork", "namespace", c.Translator.Namespace)
		return reconcile.Result{RequeueAfter: resyncInterval}, nil
	case err != nil:
		c.Log.Error("configuration from the namespace rejected; keeping the running one", "err", err)
		return reconcile.Result{RequeueAfter: resyncInterval}, nil
	}
	if err := c.Apply(cfg); err != nil {
		c.Log.Error("configuration from the namespace not applied; keeping the running one", "err", err)
	}
	return reconcile.Result{RequeueAfter: resyncInterval}, nil
}

// SetupWithManager watches the resources that make the configuration.
// Status-only updates of InferenceProviders (the operator's own condition
// writes) do not advance their generation and do not trigger a reconcile.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	whole := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.Translator.Namespace, Name: "grid"}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("grid-configuration").
		Watches(&gridv1.GridNetwork{}, whole, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&gridv1.GridSite{}, whole, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&gridv1.InferenceProvider{}, whole, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(c)
}
