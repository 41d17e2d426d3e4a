package kube

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func TestReserveEpochRisesAcrossStarts(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	first, err := ReserveEpoch(ctx, c, "grid", "east", 1000)
	if err != nil || first != 1000 {
		t.Fatalf("first start: %d, %v; want the wall clock, 1000", first, err)
	}
	// A restart on another node whose clock is behind still goes up.
	second, err := ReserveEpoch(ctx, c, "grid", "east", 500)
	if err != nil || second != 1001 {
		t.Fatalf("restart with a slow clock: %d, %v; want 1001", second, err)
	}
	third, err := ReserveEpoch(ctx, c, "grid", "east", 5000)
	if err != nil || third != 5000 {
		t.Fatalf("restart later: %d, %v; want 5000", third, err)
	}
	other, err := ReserveEpoch(ctx, c, "grid", "west", 10)
	if err != nil || other != 10 {
		t.Fatalf("another site's epoch: %d, %v; want its own ConfigMap", other, err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: "grid", Name: "grid-epoch-east"}, &cm); err != nil || cm.Data[EpochKey] != "5000" {
		t.Errorf("configmap holds %v (%v), want 5000", cm.Data, err)
	}
}

// TestReserveEpochRace: two starts at once, each seeing the same
// resourceVersion; exactly one update wins, the other re-reads and takes a
// higher epoch. Neither ever gets the same epoch.
func TestReserveEpochRace(t *testing.T) {
	ctx := context.Background()
	seed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "grid", Name: "grid-epoch-east"}, Data: map[string]string{EpochKey: "100"}}
	var (
		mu        sync.Mutex
		conflicts int
		held      int // first reads held so far
		reads     sync.WaitGroup
	)
	reads.Add(2)
	c := fake.NewClientBuilder().WithObjects(seed).WithInterceptorFuncs(interceptor.Funcs{
		// Hold both starts' first reads until both have read, so both
		// update from the same resourceVersion.
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			err := c.Get(ctx, key, obj, opts...)
			mu.Lock()
			first := held < 2
			held++
			mu.Unlock()
			if first {
				reads.Done()
				reads.Wait()
			}
			return err
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			err := c.Update(ctx, obj, opts...)
			if apierrors.IsConflict(err) {
				mu.Lock()
				conflicts++
				mu.Unlock()
			}
			return err
		},
	}).Build()

	epochs := make([]int64, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { epochs[i], errs[i] = ReserveEpoch(ctx, c, "grid", "east", 50) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(epochs)
	if epochs[0] != 101 || epochs[1] != 102 {
		t.Errorf("epochs %v, want 101 and 102: one start per epoch", epochs)
	}
	if conflicts != 1 {
		t.Errorf("%d conflicts, want exactly one loser of the first round", conflicts)
	}
}

func TestReserveEpochRefusesACorruptMark(t *testing.T) {
	seed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "grid", Name: "grid-epoch-east"}, Data: map[string]string{EpochKey: "soon"}}
	c := fake.NewClientBuilder().WithObjects(seed).Build()
	_, err := ReserveEpoch(context.Background(), c, "grid", "east", 50)
	if err == nil || !strings.Contains(err.Error(), "grid/grid-epoch-east") || !strings.Contains(err.Error(), "delete the ConfigMap") {
		t.Errorf("corrupt mark: %v, want an error naming the ConfigMap and the way out", err)
	}
}

func TestReserveEpochGivesUpOnEndlessConflicts(t *testing.T) {
	seed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "grid", Name: "grid-epoch-east"}, Data: map[string]string{EpochKey: "1"}}
	c := fake.NewClientBuilder().WithObjects(seed).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error {
			return apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "grid-epoch-east", nil)
		},
	}).Build()
	if _, err := ReserveEpoch(context.Background(), c, "grid", "east", 50); err == nil || !strings.Contains(err.Error(), "conflicting") {
		t.Errorf("endless conflicts: %v", err)
	}
}
