package kube

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gridv1 "github.com/grid-inference/grid/api/v1alpha1"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/readiness"
)

const ns = "grid"

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := gridv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func secret(name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func network() *gridv1.GridNetwork {
	return &gridv1.GridNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grid"}, Spec: gridv1.GridNetworkSpec{
		Site: "east", TrustDomain: "grid.example.com",
		TLS:              gridv1.SiteTLS{CASecretRef: gridv1.SecretKeyRef{Name: "grid-ca", Key: "ca.crt"}, SiteSecretName: "grid-east"},
		PeerPollInterval: &metav1.Duration{Duration: 3 * time.Second},
	}}
}

func provider(name string, generation int64) *gridv1.InferenceProvider {
	return &gridv1.InferenceProvider{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("u-" + name), Generation: generation},
		Spec: gridv1.InferenceProviderSpec{Model: "Qwen/Qwen3-8B", Kind: "epp", Upstream: "http://" + name + ".svc:8000",
			Metrics: gridv1.ProviderMetrics{Endpoint: "http://" + name + "-epp.svc:9090", PoolName: name,
				Timeout:              &metav1.Duration{Duration: 500 * time.Millisecond},
				RefreshInterval:      &metav1.Duration{Duration: time.Second},
				BearerTokenSecretRef: &gridv1.SecretKeyRef{Name: "epp-token", Key: "token"}}},
	}
}

// namespace is a complete site: its network, two peers, two providers and
// the Secrets they reference.
func namespace() []client.Object {
	return []client.Object{
		network(),
		&gridv1.GridSite{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "west"}, Spec: gridv1.GridSiteSpec{Signals: "https://west.example:9091", Gateway: "https://west.example:8081"}},
		&gridv1.GridSite{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "central"}, Spec: gridv1.GridSiteSpec{Signals: "https://central.example:9091"}},
		provider("qwen-b", 3), provider("qwen-a", 1),
		secret("grid-ca", map[string]string{"ca.crt": "CA PEM"}),
		secret("grid-east", map[string]string{"tls.crt": "CERT PEM", "tls.key": "KEY PEM"}),
		secret("epp-token", map[string]string{"token": "s3cret"}),
	}
}

func translator(t *testing.T, c client.Reader) *Translator {
	return &Translator{Reader: c, Namespace: ns, Dir: t.TempDir(),
		Base: config.Operator{Signals: config.Listener{Listen: "0.0.0.0:9091"}, Metrics: config.Listener{Listen: "0.0.0.0:9090"}}}
}

// TestTranslateIsTheFileModeConfiguration: the namespace becomes the
// configuration a file would hold, defaulted and validated the same way,
// with each provider's revision taken from its object and every referenced
// Secret key written to a private file.
func TestTranslateIsTheFileModeConfiguration(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(namespace()...).Build()
	tr := translator(t, c)
	cfg, err := tr.Config(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Site != "east" || cfg.TrustDomain != "grid.example.com" || cfg.PeerPollInterval.D() != 3*time.Second {
		t.Errorf("site %q, trust domain %q, peer poll %v", cfg.Site, cfg.TrustDomain, cfg.PeerPollInterval)
	}
	if cfg.ScrapeInterval.D() != config.DefaultScrapeInterval {
		t.Errorf("scrape interval %v: file-mode default not applied", cfg.ScrapeInterval)
	}
	if len(cfg.Peers) != 2 || !cfg.Peers[0].Equal(config.Peer{Site: "central", Signals: "https://central.example:9091"}) ||
		!cfg.Peers[1].Equal(config.Peer{Site: "west", Signals: "https://west.example:9091", Gateway: "https://west.example:8081"}) {
		t.Errorf("peers %+v", cfg.Peers)
	}
	if len(cfg.Providers) != 2 || cfg.Providers[0].Name != "qwen-a" || cfg.Providers[1].Name != "qwen-b" {
		t.Fatalf("providers %+v", cfg.Providers)
	}
	b := cfg.Providers[1]
	if *b.Object != (config.ObjectRevision{UID: "u-qwen-b", Generation: 3}) {
		t.Errorf("revision %+v, want the object's uid and generation", *b.Object)
	}
	if b.Metrics.Path != "/metrics" || b.Metrics.Timeout.D() != 500*time.Millisecond || b.Metrics.PoolName != "qwen-b" || b.Metrics.RefreshInterval.D() != time.Second {
		t.Errorf("metrics %+v", b.Metrics)
	}
	for file, want := range map[string]string{cfg.TLS.CA: "CA PEM", cfg.TLS.Cert: "CERT PEM", cfg.TLS.Key: "KEY PEM", b.Metrics.BearerTokenFile: "s3cret"} {
		got, err := os.ReadFile(file)
		if err != nil || string(got) != want || !strings.HasPrefix(file, tr.Dir) {
			t.Errorf("%s: %q, %v; want %q under %s", file, got, err, want, tr.Dir)
		}
		if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", file, fi.Mode().Perm())
		}
	}
	if cfg.StateDir != filepath.Join(tr.Dir, "state") {
		t.Errorf("state dir %q", cfg.StateDir)
	}
}

func TestTranslateRefuses(t *testing.T) {
	second := network()
	second.Name = "other"
	badProvider := provider("Qwen_A", 1)
	for name, tc := range map[string]struct {
		drop string // an object name left out of the namespace
		add  client.Object
		want string
	}{
		"no network":           {drop: "grid", want: ErrNoNetwork.Error()},
		"two networks":         {add: second, want: "2 GridNetworks in namespace grid (grid, other)"},
		"missing secret":       {drop: "grid-east", want: "secret grid/grid-east"},
		"file-mode validation": {add: badProvider, want: `GridNetwork grid/grid: providers[0].name: "Qwen_A" is not a DNS-1123 label`},
	} {
		t.Run(name, func(t *testing.T) {
			var objs []client.Object
			for _, o := range namespace() {
				if o.GetName() != tc.drop {
					objs = append(objs, o)
				}
			}
			if tc.add != nil {
				objs = append(objs, tc.add)
			}
			c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).Build()
			_, err := translator(t, c).Config(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestReconcileAppliesOnlyValidConfigurations: a reconcile applies what the
// namespace declares; a namespace that does not translate applies nothing.
func TestReconcileAppliesOnlyValidConfigurations(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(namespace()...).Build()
	var applied []*config.Operator
	ctl := &Controller{Translator: translator(t, c), Log: slog.New(slog.DiscardHandler),
		Apply: func(cfg *config.Operator) error { applied = append(applied, cfg); return nil }}
	ctx := context.Background()
	if _, err := ctl.Reconcile(ctx, reconcile.Request{}); err != nil || len(applied) != 1 {
		t.Fatalf("first reconcile: %v, %d applied", err, len(applied))
	}
	// A spec change advances the generation: the provider's revision moves.
	var ip gridv1.InferenceProvider
	c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-a"}, &ip)
	ip.Spec.Unavailable = true
	ip.Generation = 2
	if err := c.Update(ctx, &ip); err != nil {
		t.Fatal(err)
	}
	ctl.Reconcile(ctx, reconcile.Request{})
	if a := applied[len(applied)-1].Providers[0]; !a.Unavailable || a.Object.Generation != 2 {
		t.Errorf("after the spec change: unavailable %v, generation %d", a.Unavailable, a.Object.Generation)
	}
	// An invalid change is not applied.
	ip.Spec.Upstream = "ftp://nowhere"
	c.Update(ctx, &ip)
	n := len(applied)
	if res, err := ctl.Reconcile(ctx, reconcile.Request{}); err != nil || res.RequeueAfter == 0 || len(applied) != n {
		t.Errorf("invalid namespace: %v, requeue %v, applied %d more", err, res.RequeueAfter, len(applied)-n)
	}
}

// TestStatusWritesOnlyChanges: the Ready condition is written when status,
// reason or generation changes, and not otherwise; the message alone does
// not cause a write.
func TestStatusWritesOnlyChanges(t *testing.T) {
	ctx := context.Background()
	writes := 0
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(provider("qwen-a", 1)).
		WithStatusSubresource(&gridv1.InferenceProvider{}).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			writes++
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		}}).Build()
	verdict := readiness.Verdict{Reason: readiness.ScrapeTimedOut, Status: readiness.False, Message: "timeout after 2s"}
	w := &StatusWriter{Client: c, Namespace: ns, Timeout: time.Second, Now: time.Now,
		Verdicts: func() map[string]readiness.Verdict {
			return map[string]readiness.Verdict{"qwen-a": verdict, "gone": verdict}
		}}
	pass := func() int {
		t.Helper()
		n, err := w.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	readCondition := func() (*metav1.Condition, int64) {
		var ip gridv1.InferenceProvider
		c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-a"}, &ip)
		return meta.FindStatusCondition(ip.Status.Conditions, ConditionReady), ip.Status.ObservedGeneration
	}
	if n := pass(); n != 1 {
		t.Fatalf("first pass wrote %d", n)
	}
	cond, observed := readCondition()
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "ScrapeTimedOut" || cond.ObservedGeneration != 1 || observed != 1 {
		t.Fatalf("condition %+v, observed %d", cond, observed)
	}
	verdict.Message = "timeout after 2.1s"
	if n := pass(); n != 0 {
		t.Errorf("unchanged status and reason: %d writes", n)
	}
	verdict = readiness.Verdict{Reason: readiness.Ready, Status: readiness.True}
	if n := pass(); n != 1 {
		t.Errorf("reason changed: %d writes", n)
	}
	var ip gridv1.InferenceProvider
	c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-a"}, &ip)
	ip.Generation = 2
	c.Update(ctx, &ip)
	if n := pass(); n != 1 {
		t.Errorf("generation changed: %d writes", n)
	}
	if cond, observed := readCondition(); cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != 2 || observed != 2 {
		t.Errorf("condition %+v, observed %d", cond, observed)
	}
	if writes != 3 {
		t.Errorf("%d status writes in all, want 3", writes)
	}
}

// TestStatusWriteIsBounded: a write that hangs is cut at the timeout, the
// pass goes on and reports it.
func TestStatusWriteIsBounded(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(provider("qwen-a", 1), provider("qwen-b", 1)).
		WithStatusSubresource(&gridv1.InferenceProvider{}).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			if obj.GetName() == "qwen-a" {
				<-ctx.Done()
				return ctx.Err()
			}
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		}}).Build()
	v := readiness.Verdict{Reason: readiness.Ready, Status: readiness.True}
	w := &StatusWriter{Client: c, Namespace: ns, Timeout: 50 * time.Millisecond, Now: time.Now,
		Verdicts: func() map[string]readiness.Verdict { return map[string]readiness.Verdict{"qwen-a": v, "qwen-b": v} }}
	start := time.Now()
	n, err := w.Pass(context.Background())
	if n != 1 || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "grid/qwen-a") {
		t.Errorf("wrote %d, err %v; want qwen-b written and qwen-a's timeout reported", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("pass took %v", d)
	}
}

// TestStartupProbesWhileWaiting: while the namespace has no GridNetwork the
// operator is alive and not ready, and its readiness says why; once the
// resources exist, Wait returns their configuration.
func TestStartupProbesWhileWaiting(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).Build()
	startup := &Startup{}
	probe := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		startup.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := probe("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("before waiting: %d %q", code, body)
	}
	done := make(chan error, 1)
	tr := translator(t, c)
	go func() {
		_, err := tr.Wait(t.Context(), slog.New(slog.DiscardHandler), startup)
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := probe("/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "no GridNetwork") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz while waiting: %d %q", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, _ := probe("/healthz"); code != http.StatusOK {
		t.Errorf("healthz while waiting: %d, want 200 (a restart would not help)", code)
	}
	for _, o := range namespace() {
		if err := c.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Wait did not return once the resources existed")
	}
}

// TestAccessPolicyBecomesSharedModels: a provider's accessPolicy selects
// the GridSites (by their labels) that may read it and route to it; the
// translation gives each peer the models every provider of which admits it
// (the most restrictive policy of a model wins), and nil when no provider
// has a policy.
func TestAccessPolicyBecomesSharedModels(t *testing.T) {
	eu := provider("eu-only", 1)
	eu.Spec.Model = "private-model"
	eu.Spec.AccessPolicy = &gridv1.AccessPolicy{SiteSelector: metav1.LabelSelector{MatchLabels: map[string]string{"region": "eu"}}}
	twin := provider("qwen-eu", 1) // a second provider of Qwen, restricted to eu
	twin.Spec.AccessPolicy = &gridv1.AccessPolicy{SiteSelector: metav1.LabelSelector{MatchLabels: map[string]string{"region": "eu"}}}
	objs := append(namespace(), eu, twin)
	for _, o := range objs {
		if s, ok := o.(*gridv1.GridSite); ok && s.Name == "west" {
			s.Spec.Labels = map[string]string{"region": "eu"}
		}
	}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).Build()
	cfg, err := translator(t, c).Config(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, p := range cfg.Peers {
		got[p.Site] = p.Models
	}
	if w := got["west"]; !slices.Equal(w, []string{"Qwen/Qwen3-8B", "private-model"}) {
		t.Errorf("west (region=eu) may use %v", w)
	}
	if c := got["central"]; c == nil || len(c) != 0 {
		t.Errorf("central (no labels) may use %v, want nothing: each model has a provider that does not admit it", c)
	}
	// Without any policy, peers are unrestricted.
	c2 := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(namespace()...).Build()
	cfg, err = translator(t, c2).Config(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cfg.Peers {
		if p.Models != nil {
			t.Errorf("peer %s restricted to %v without any policy", p.Site, p.Models)
		}
	}
}
