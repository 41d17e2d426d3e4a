package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gridv1 "github.com/grid-inference/grid/api/v1alpha1"
	"github.com/grid-inference/grid/internal/readiness"
)

// ConditionReady is the InferenceProvider condition the operator writes.
const ConditionReady = "Ready"

// StatusWriter writes each InferenceProvider's Ready condition from the
// operator's readiness verdicts. A write happens only when the condition's
// status, reason or observed generation would change, so a steady grid
// costs the API server nothing; each write is bounded by Timeout, and
// passes run one at a time (Pass is called from one loop).
type StatusWriter struct {
	Client    client.Client
	Namespace string
	// Verdicts returns the operator's latest verdict per provider name.
	Verdicts func() map[string]readiness.Verdict
	// Timeout bounds one status write.
	Timeout time.Duration
	// Now stamps lastTransitionTime.
	Now func() time.Time
}

// Run makes a pass every interval until ctx ends, logging failed writes.
func (w *StatusWriter) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if _, err := w.Pass(ctx); err != nil && ctx.Err() == nil {
			log.Warn("provider status not written", "err", err)
		}
	}
}

// Pass writes every provider whose condition changed and returns how many
// it wrote; it carries on past a failed write and returns the first error.
func (w *StatusWriter) Pass(ctx context.Context) (int, error) {
	var list gridv1.InferenceProviderList
	if err := w.Client.List(ctx, &list, client.InNamespace(w.Namespace)); err != nil {
		return 0, fmt.Errorf("status: list InferenceProviders: %w", err)
	}
	verdicts := w.Verdicts()
	written := 0
	var first error
	for i := range list.Items {
		ip := &list.Items[i]
		v, ok := verdicts[ip.Name]
		if !ok {
			continue // not scraped yet under this name: nothing to say
		}
		cur := meta.FindStatusCondition(ip.Status.Conditions, ConditionReady)
		if cur != nil && cur.Status == metav1.ConditionStatus(v.Status) && cur.Reason == string(v.Reason) &&
			cur.ObservedGeneration == ip.Generation && ip.Status.ObservedGeneration == ip.Generation {
			continue
		}
		patch := client.MergeFrom(ip.DeepCopy())
		meta.SetStatusCondition(&ip.Status.Conditions, metav1.Condition{
			Type: ConditionReady, Status: metav1.ConditionStatus(v.Status), Reason: string(v.Reason),
			Message: v.Message, ObservedGeneration: ip.Generation, LastTransitionTime: metav1.NewTime(w.Now()),
		})
		ip.Status.ObservedGeneration = ip.Generation
		wctx, cancel := context.WithTimeout(ctx, w.Timeout)
		err := w.Client.Status().Patch(wctx, ip, patch)
		cancel()
		if err != nil {
			if first == nil {
				first = fmt.Errorf("status: InferenceProvider %s/%s: %w", w.Namespace, ip.Name, err)
			}
			continue
		}
		written++
	}
	return written, first
}
