package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gridv1 "github.com/grid-inference/grid/api/v1alpha1"
)

const chartDir = "../deploy/helm/grid"

// render runs `helm template` of the chart with args and returns the
// objects it renders.
func render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	helm := binary(t, helmPart)
	out, err := exec.Command(helm, append([]string{"template", "grid", chartDir, "--namespace", "grid"}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("helm template %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatal(err)
	}
	return decodeAll(t, out)
}

// decodeAll decodes a multi-document YAML stream into objects.
func decodeAll(t *testing.T, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// apply applies obj server-side as field manager grid-e2e (dry-run when
// dryRun), in namespace ns when it has none.
func apply(ctx context.Context, c client.Client, obj *unstructured.Unstructured, ns string, dryRun bool) error {
	if obj.GetNamespace() == "" && obj.GetKind() != "CustomResourceDefinition" && obj.GetKind() != "Namespace" {
		obj.SetNamespace(ns)
	}
	opts := []client.ApplyOption{client.FieldOwner("grid-e2e"), client.ForceOwnership}
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), opts...); err != nil {
		return fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// installCRDs applies deploy/crds and waits until each is Established.
func installCRDs(t *testing.T, cp *controlPlane) {
	t.Helper()
	ctx := context.Background()
	c := cp.admin(t)
	files, _ := filepath.Glob("../deploy/crds/*.yaml")
	if len(files) == 0 {
		t.Fatal("no CRDs in deploy/crds")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range decodeAll(t, b) {
			if err := apply(ctx, c, obj, "", false); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			eventually(t, "CRD "+obj.GetName()+" established", 30*time.Second, func() bool {
				var crd apiextensionsv1.CustomResourceDefinition
				if c.Get(ctx, types.NamespacedName{Name: obj.GetName()}, &crd) != nil {
					return false
				}
				for _, cond := range crd.Status.Conditions {
					if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
						return true
					}
				}
				return false
			})
		}
	}
}

// TestHelmChartOnARealAPIServer applies the generated CRDs to a real
// kube-apiserver and every object the chart renders, with its default
// values and with every option on, server-side in dry-run: the API server
// validates each against its schema (the Grid resources against the CRDs'
// OpenAPI schemas). ServiceMonitor is prometheus-operator's; its CRD is not
// Grid's to install, so it is left out as .ci/helm leaves it out.
func TestHelmChartOnARealAPIServer(t *testing.T) {
	cp := startControlPlane(t)
	installCRDs(t, cp)
	ctx := context.Background()
	c := cp.admin(t)
	cp.namespace(t, "grid")
	for name, args := range map[string][]string{
		"defaults":    {"--set", "site=east"},
		"full values": {"-f", chartDir + "/ci/full-values.yaml"},
	} {
		objs := render(t, args...)
		applied := map[string]int{}
		for _, obj := range objs {
			if obj.GetKind() == "ServiceMonitor" {
				continue
			}
			if err := apply(ctx, c, obj, "grid", true); err != nil {
				t.Errorf("%s: the API server refuses %v", name, err)
			}
			applied[obj.GetKind()]++
		}
		t.Logf("%s: %d objects applied in dry-run: %v", name, len(objs), applied)
		if applied["Deployment"] != 2 || applied["Role"] != 1 || applied["GridNetwork"] != 1 {
			t.Errorf("%s: rendered %v; want the two Deployments, the Role and the GridNetwork", name, applied)
		}
	}
}

// TestOperatorOnARealAPIServer runs `grid operator --kubernetes` against a
// real kube-apiserver as the ServiceAccount the Helm chart renders, bound
// to the chart's Role, with a token the API server issued: every read and
// write it makes is authorized by RBAC as in a cluster. The chart's
// objects are applied for real with one provider, a real
// llm-d-inference-sim, and one peer, a file-mode site. The operator reads
// the resources and the Secrets they name, writes the provider's Ready
// condition, polls the GridSite over mutual TLS (its gateway reads the
// peer's provider), reserves its epoch in the ConfigMap, follows a spec
// change, and reserves a higher epoch after a restart.
func TestOperatorOnARealAPIServer(t *testing.T) {
	cp := startControlPlane(t)
	installCRDs(t, cp)
	ctx := context.Background()
	c := cp.admin(t)
	cp.namespace(t, "grid")
	// East's operator runs in Kubernetes mode with one provider and one
	// peer, west: file-mode Grid with its own simulator.
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	gridCerts(t, certs, "east", "west")
	sim, _ := startSim(t, 4, 10)
	westSim, _ := startSim(t, 4, 10)
	west := newSite(t, "west", provider{name: "west-sim", model: simModel, kind: "vllm", upstream: westSim, metrics: westSim})
	east := newSite(t, "east")
	east.gatewayOnly, east.peers, west.peers = true, []*site{west}, []*site{east}
	west.start(t, dir)
	objs := render(t, "--set", "site=east",
		"--set", "providers[0].name=sim", "--set", "providers[0].model="+simModel, "--set", "providers[0].kind=vllm",
		"--set", "providers[0].metrics.endpoint="+sim, "--set", "providers[0].upstream="+sim,
		"--set", "peers[0].name=west", "--set", "peers[0].signals=https://"+addr(west.signals), "--set", "peers[0].gateway=https://"+addr(west.hop))
	var serviceAccount string
	for _, obj := range objs {
		if obj.GetKind() == "ServiceMonitor" {
			continue
		}
		if obj.GetKind() == "ServiceAccount" && strings.HasSuffix(obj.GetName(), "-operator") {
			serviceAccount = obj.GetName()
		}
		if err := apply(ctx, c, obj, "grid", false); err != nil {
			t.Fatal(err)
		}
	}
	if serviceAccount == "" {
		t.Fatal("the chart renders no operator ServiceAccount")
	}

	// The site identity's Secrets, under the names the chart's values
	// give (tls.caSecret, tls.siteSecret).
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(certs, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, s := range []*corev1.Secret{
		{Data: map[string][]byte{"ca.crt": read("ca.crt")}},
		{Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": read("east.crt"), "tls.key": read("east.key")}},
	} {
		s.Namespace = "grid"
		if s.Type == corev1.SecretTypeTLS {
			s.Name = "grid-site"
		} else {
			s.Name = "grid-ca"
		}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	kubeconfig := cp.kubeconfig(t, serviceAccount, cp.serviceAccountToken(t, "grid", serviceAccount))
	startOperator := func() *process {
		return run(t, binary(t, gridPart), []string{"KUBECONFIG=" + kubeconfig},
			"operator", "--kubernetes", "--namespace", "grid", "--data-dir", t.TempDir(),
			"--signals-listen", addr(east.signals), "--metrics-listen", addr(east.opMetrics), "--drain-timeout", "1s")
	}
	op := startOperator()
	east.start(t, dir) // its gateway, polling the operator above

	condition := func() (status, reason string, observed, generation int64) {
		var p gridv1.InferenceProvider
		if c.Get(ctx, types.NamespacedName{Namespace: "grid", Name: "sim"}, &p) != nil {
			return
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == "Ready" {
				return string(cond.Status), cond.Reason, cond.ObservedGeneration, p.Generation
			}
		}
		return "", "", 0, p.Generation
	}
	eventually(t, "the provider's Ready condition True at its generation", 30*time.Second, func() bool {
		status, reason, observed, generation := condition()
		return status == "True" && reason == "Ready" && observed == generation
	})
	if v, _ := metric(east.operatorMetrics(), "grid_provider_ready", `grid_provider="sim"`); v != 1 {
		t.Errorf("the operator's /metrics: grid_provider_ready of sim is %v, want 1", v)
	}
	// The GridSite is polled over mutual TLS with the identity the
	// Secrets hold, and what west publishes reaches east's gateway.
	eventually(t, "east's gateway reads west's provider ready", 30*time.Second, func() bool {
		ready, _ := east.seesReady("west-sim")
		return ready
	})
	if a := chat(ctx, "http://"+addr(east.client), 4, true); a.status != 200 || !a.done {
		t.Errorf("a request at east's gateway: %+v", a)
	}
	epoch := func() int64 {
		var cm corev1.ConfigMap
		if c.Get(ctx, types.NamespacedName{Namespace: "grid", Name: "grid-epoch-east"}, &cm) != nil {
			return 0
		}
		e, _ := strconv.ParseInt(cm.Data["publisherEpoch"], 10, 64)
		return e
	}
	first := epoch()
	if first == 0 {
		t.Fatal("no publisher epoch in ConfigMap grid-epoch-east")
	}

	// A spec change is one reconcile: the provider taken out of service.
	var p gridv1.InferenceProvider
	if err := c.Get(ctx, types.NamespacedName{Namespace: "grid", Name: "sim"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Unavailable = true
	if err := c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the provider's Ready condition False, ProviderUnavailable, at the new generation", 30*time.Second, func() bool {
		status, reason, observed, generation := condition()
		return status == "False" && reason == "ProviderUnavailable" && observed == generation
	})

	// A restart keeps the ConfigMap and reserves an epoch above it.
	op.stop(t)
	startOperator()
	eventually(t, "a higher epoch after the restart", 30*time.Second, func() bool { return epoch() > first })
	if strings.Contains(op.output(), "forbidden") {
		t.Errorf("the operator was refused something its Role should give it:\n%s", op.output())
	}
}
