// Package kube holds what the operator's Kubernetes mode keeps in the
// cluster. It starts with the publisher epoch: in Kubernetes an operator
// may restart on another node, where no stateDir survives, so the epoch's
// high-water mark lives in a ConfigMap per site, reserved at every start
// with compare-and-swap on its resourceVersion.
package kube

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EpochKey is the ConfigMap data key holding the high-water mark.
const EpochKey = "publisherEpoch"

// EpochConfigMapName is the ConfigMap of a site's publisher epoch.
func EpochConfigMapName(site string) string { return "grid-epoch-" + site }

// maxEpochAttempts bounds the compare-and-swap retries: each conflict means
// another start reserved an epoch in between, which is rare.
const maxEpochAttempts = 16

// ReserveEpoch reserves a publisher epoch for this start of site's operator:
// above every epoch reserved before (the ConfigMap's mark) and at least
// nowMs. The ConfigMap is created on first use and updated only when its
// resourceVersion is the one read, so two starts at once never reserve the
// same epoch: exactly one update wins each round, the other reads again and
// takes the next. Nothing may be published before this returns.
func ReserveEpoch(ctx context.Context, c client.Client, namespace, site string, nowMs int64) (int64, error) {
	key := client.ObjectKey{Namespace: namespace, Name: EpochConfigMapName(site)}
	for range maxEpochAttempts {
		var cm corev1.ConfigMap
		err := c.Get(ctx, key, &cm)
		switch {
		case apierrors.IsNotFound(err):
			epoch := nowMs
			cm = corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: key.Name,
					Labels: map[string]string{"app.kubernetes.io/name": "grid", "grid.inference/site": site}},
				Data: map[string]string{EpochKey: strconv.FormatInt(epoch, 10)},
			}
			if err := c.Create(ctx, &cm); apierrors.IsAlreadyExists(err) {
				continue // another start created it first: read theirs
			} else if err != nil {
				return 0, fmt.Errorf("reserve epoch: create configmap %s: %w", key, err)
			}
			return epoch, nil
		case err != nil:
			return 0, fmt.Errorf("reserve epoch: read configmap %s: %w", key, err)
		}
		last, err := strconv.ParseInt(cm.Data[EpochKey], 10, 64)
		if err != nil {
			// Like a corrupt state file: guessing could publish below a
			// published epoch.
			return 0, fmt.Errorf("reserve epoch: configmap %s key %s is %q, not an integer; fix it, or delete the ConfigMap to start a new epoch from the wall clock",
				key, EpochKey, cm.Data[EpochKey])
		}
		epoch := max(nowMs, last+1)
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[EpochKey] = strconv.FormatInt(epoch, 10)
		// Update carries the resourceVersion read: a write in between
		// makes it a conflict.
		if err := c.Update(ctx, &cm); apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return 0, fmt.Errorf("reserve epoch: update configmap %s: %w", key, err)
		}
		return epoch, nil
	}
	return 0, fmt.Errorf("reserve epoch: configmap %s: still conflicting after %d attempts", key, maxEpochAttempts)
}
