package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// eppModuleDir is where the Go module cache holds the EPP's module: its
// CRDs are installed from there, at the version parts/epp pins.
func eppModuleDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/gateway-api-inference-extension")
	cmd.Dir = "parts/epp"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("download the EPP's module: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("the EPP's module has no directory in the module cache: %s", out)
	}
	return m.Dir
}

// TestRealEPP runs the Gateway API Inference Extension's endpoint picker
// against a real kube-apiserver, with an InferencePool whose two Pods are
// objects the test creates (no kubelet runs: their status, loopback IPs
// and Ready condition, is written by the test as a kubelet would). Both
// pods' endpoints reach one llm-d-inference-sim (a process on loopback
// listens on every 127.0.0.0/8 address), so each reports the engine's
// load. Grid's operator scrapes the EPP's real /metrics with a
// ServiceAccount token that the EPP's authentication really checks
// (TokenReview and SubjectAccessReview against the API server), and the
// test asserts what Grid publishes: ready endpoints, in-flight (running
// and queued), the pool filter, and a pod going unready.
func TestRealEPP(t *testing.T) {
	cp := startControlPlane(t)
	ctx := context.Background()
	c := cp.admin(t)
	crds := filepath.Join(eppModuleDir(t), "config/crd/bases")
	for _, name := range []string{"inference.networking.k8s.io_inferencepools.yaml", "inference.networking.x-k8s.io_inferenceobjectives.yaml",
		"inference.networking.x-k8s.io_inferencemodelrewrites.yaml"} {
		b, err := os.ReadFile(filepath.Join(crds, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range decodeAll(t, b) {
			if err := apply(ctx, c, obj, "", false); err != nil {
				t.Fatal(err)
			}
		}
	}
	cp.namespace(t, "llm-d")

	// One engine of two slots behind both pods.
	simURL, _ := startSim(t, 2, 20)
	var simPort int
	fmt.Sscanf(simURL, "http://127.0.0.1:%d", &simPort)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "qwen-pool", "namespace": "llm-d"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "qwen"}},
			"targetPorts":       []any{map[string]any{"number": int64(simPort)}},
			"endpointPickerRef": map[string]any{"name": "qwen-pool-epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	if err := apply(ctx, c, pool, "llm-d", false); err != nil {
		t.Fatal(err)
	}
	for i, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		pod := &corev1.Pod{}
		pod.Namespace, pod.Name, pod.Labels = "llm-d", fmt.Sprintf("qwen-%d", i), map[string]string{"app": "qwen"}
		pod.Spec.Containers = []corev1.Container{{Name: "vllm", Image: "ghcr.io/llm-d/llm-d-inference-sim:v0.10.2"}}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		setPodReady(t, cp, pod.Name, ip, true)
	}

	// The EPP runs as the admin (it needs TokenReview, SubjectAccessReview
	// and its pool); Grid scrapes as a ServiceAccount allowed GET /metrics.
	eppMetrics, eppGRPC, eppHealth := freePort(t), freePort(t), freePort(t)
	run(t, binary(t, eppPart), []string{"KUBECONFIG=" + cp.kubeconfig(t, "epp-admin", cp.adminToken)},
		"--pool-name", "qwen-pool", "--pool-namespace", "llm-d",
		"--grpc-port", fmt.Sprint(eppGRPC), "--grpc-health-port", fmt.Sprint(eppHealth), "--metrics-port", fmt.Sprint(eppMetrics),
		"--tracing=false", "--secure-serving=false",
		// The pool gauges are flushed every 5 s by default; 1 s keeps the
		// test short (docs/operator.md says what the default costs).
		"--refresh-prometheus-metrics-interval", "1s")
	reader := &corev1.ServiceAccount{}
	reader.Namespace, reader.Name = "grid", "grid-metrics-reader"
	role := &rbacv1.ClusterRole{Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	role.Name = "epp-metrics-reader"
	binding := &rbacv1.ClusterRoleBinding{RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "grid", Name: reader.Name}}}
	binding.Name = role.Name
	cp.namespace(t, "grid")
	for _, obj := range []client.Object{reader, role, binding} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("%s: %v", obj.GetName(), err)
		}
	}
	token := cp.serviceAccountToken(t, "grid", reader.Name)
	eppURL := "http://" + addr(eppMetrics)
	exposition := func(bearer string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, eppURL+"/metrics", nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	eventually(t, "the EPP's /metrics answers the reader's token with its pool", 60*time.Second, func() bool {
		code, body := exposition(token)
		return code == http.StatusOK && strings.Contains(body, `name="qwen-pool"`)
	})
	if code, _ := exposition(""); code != http.StatusUnauthorized {
		t.Errorf("the EPP's /metrics without a token answered %d, want 401", code)
	}
	// Grid's operator: the pool's provider, and one filtered on a pool
	// the EPP does not serve.
	dir := t.TempDir()
	gridCerts(t, dir+"/certs", "east")
	tokenFile := filepath.Join(dir, "epp-token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	east := newSite(t, "east",
		provider{name: "qwen-pool", model: simModel, kind: "epp", upstream: simURL, metrics: eppURL, pool: "qwen-pool", tokenFile: tokenFile, refresh: "1s"},
		provider{name: "other-pool", model: simModel, kind: "epp", upstream: simURL, metrics: eppURL, pool: "other-pool", tokenFile: tokenFile})
	east.start(t, dir)
	gauge := func(name, provider string) float64 {
		v, _ := providerGauge(east, name, provider)
		return v
	}
	eventually(t, "the pool read ready with its two pods", 30*time.Second, func() bool {
		return gauge("grid_provider_ready", "qwen-pool") == 1 && gauge("grid_provider_ready_endpoints", "qwen-pool") == 2
	})
	// The EPP reports its own pool's readiness and nothing of other-pool:
	// that pool is not served there, and is taken out, saying why.
	eventually(t, "the provider of a pool the EPP does not serve out of routing", 30*time.Second, func() bool {
		v, ok := metric(east.operatorMetrics(), "grid_provider_readiness", `grid_provider="other-pool"`, `reason="NoEndpointsReady"`)
		return ok && v == 1 && gauge("grid_provider_ready", "other-pool") == 0
	})
	if !strings.Contains(east.operator.output(), "not of poolName other-pool") {
		t.Errorf("the operator's log does not say which pools the EPP serves:\n%s", east.operator.output())
	}

	// Four answers of 4 s on the engine's two slots: each endpoint reports
	// two running and two waiting, and Grid reads the pool's in-flight as
	// the per-endpoint average times its ready endpoints.
	wait := hold(simURL, 4, 200)
	eventually(t, "the pool's load read through the EPP", 20*time.Second, func() bool {
		return gauge("grid_provider_in_flight_requests", "qwen-pool") == 8
	})
	wait()
	// The pool series this EPP exports are the legacy names Grid reads
	// when the llm-d router's current ones are absent (docs/operator.md).
	_, body := exposition(token)
	names := slices.Compact(slices.Sorted(slices.Values(poolSeries.FindAllString(body, -1))))
	t.Logf("the EPP's pool series: %v", names)
	for _, want := range []string{"inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size",
		"inference_pool_average_running_requests", "inference_pool_per_pod_queue_size", "inference_pool_ready_pods"} {
		if !slices.Contains(names, want) {
			t.Errorf("the EPP does not export %s", want)
		}
	}

	// The operator learns when the EPP recomputes its pool gauges from
	// what changes between its scrapes (docs/operator.md, refresh phase):
	// requests of varied lengths, one every 300 ms, change the averages
	// at most of the EPP's 1 s refreshes.
	stop := make(chan struct{})
	var senders sync.WaitGroup
	senders.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			senders.Go(func() { chat(context.Background(), simURL, 10+(i*7)%40, true) })
		}
	})
	eventually(t, "the EPP's refresh phase learnt to a tenth of its interval", 60*time.Second, func() bool {
		w, ok := providerGauge(east, "grid_provider_refresh_phase_width_seconds", "qwen-pool")
		return ok && w <= 0.1
	})
	close(stop)
	senders.Wait()

	setPodReady(t, cp, "qwen-1", "127.0.0.2", false)
	eventually(t, "one ready endpoint once a pod is unready", 30*time.Second, func() bool {
		return gauge("grid_provider_ready_endpoints", "qwen-pool") == 1
	})
	if t.Failed() {
		t.Logf("the EPP's exposition:\n%s", body)
	}
}

// poolSeries matches the names of an EPP's pool series, current and legacy.
var poolSeries = regexp.MustCompile(`(?m)^(inference_pool_[a-z_]+|llm_d_epp_[a-z_]+)`)

// setPodReady writes a pod's status as a kubelet would: running at ip,
// with its Ready condition.
func setPodReady(t *testing.T, cp *controlPlane, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	c := cp.admin(t)
	var pod corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: "llm-d", Name: name}, &pod); err != nil {
		t.Fatal(err)
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP, pod.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, &pod); err != nil {
		t.Fatal(err)
	}
}
