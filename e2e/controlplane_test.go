package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gridv1 "github.com/grid-inference/grid/api/v1alpha1"
)

// controlPlane is a real etcd and kube-apiserver on loopback, for one
// test. Its admin is a static token in group system:masters; everything
// Grid runs as authenticates with a ServiceAccount token the API server
// issued, so RBAC is checked as in a cluster.
type controlPlane struct {
	url        string
	caPEM      []byte
	adminToken string
	dir        string
	scheme     *runtime.Scheme
}

// startControlPlane starts etcd and kube-apiserver and waits until the API
// server answers /readyz.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	dir := t.TempDir()
	cp := &controlPlane{dir: dir, adminToken: "e2e-admin-token"}
	caPEM, certPEM, keyPEM := servingCert(t)
	cp.caPEM = caPEM
	saKey := ecKeyPEM(t)
	files := map[string][]byte{
		"serving.crt": certPEM, "serving.key": keyPEM, "sa.key": saKey,
		"tokens.csv": []byte(cp.adminToken + `,e2e-admin,e2e-admin,"system:masters"` + "\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	client, peer, api := freePort(t), freePort(t), freePort(t)
	etcdURL := "http://" + addr(client)
	run(t, binary(t, etcdPart), nil, "--name", "e2e", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://"+addr(peer), "--initial-advertise-peer-urls", "http://"+addr(peer),
		"--initial-cluster", "e2e=http://"+addr(peer), "--log-level", "warn")
	eventually(t, "etcd answers /health", 30*time.Second, func() bool { return get(etcdURL+"/health") != "" })

	run(t, binary(t, apiPart), nil,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(api),
		"--tls-cert-file", filepath.Join(dir, "serving.crt"), "--tls-private-key-file", filepath.Join(dir, "serving.key"),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.0.0.0/24",
		// The kubernetes Service's endpoint may not be a loopback address.
		"--endpoint-reconciler-type", "none",
		// No controller-manager runs: nothing would create a namespace's
		// default ServiceAccount, which this plugin requires of a pod.
		"--disable-admission-plugins", "ServiceAccount",
		"--enable-priority-and-fairness=false")
	cp.url = "https://" + addr(api)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	eventually(t, "kube-apiserver answers /readyz", 90*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, cp.url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.adminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	cp.scheme = runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(cp.scheme); err != nil {
		t.Fatal(err)
	}
	if err := gridv1.AddToScheme(cp.scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(cp.scheme); err != nil {
		t.Fatal(err)
	}
	return cp
}

func (cp *controlPlane) rest(token string) *rest.Config {
	return &rest.Config{Host: cp.url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM}}
}

// client returns a controller-runtime client that authenticates with token.
func (cp *controlPlane) client(t *testing.T, token string) client.Client {
	t.Helper()
	c, err := client.New(cp.rest(token), client.Options{Scheme: cp.scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (cp *controlPlane) admin(t *testing.T) client.Client { return cp.client(t, cp.adminToken) }

// namespace creates a namespace.
func (cp *controlPlane) namespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{}
	ns.Name = name
	if err := cp.admin(t).Create(context.Background(), ns); err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
}

// kubeconfig writes a kubeconfig that authenticates with token and returns
// its path, for a process the test starts (KUBECONFIG=path).
func (cp *controlPlane) kubeconfig(t *testing.T, name, token string) string {
	t.Helper()
	path := filepath.Join(cp.dir, name+".kubeconfig")
	caFile := filepath.Join(cp.dir, "ca.crt")
	if err := os.WriteFile(caFile, cp.caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: %s, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: %s}}]
current-context: e2e
`, cp.url, caFile, name, token, name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serviceAccountToken asks the API server for a token of the
// ServiceAccount (TokenRequest), as the kubelet does for a pod.
func (cp *controlPlane) serviceAccountToken(t *testing.T, namespace, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{}
	sa.Namespace, sa.Name = namespace, name
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cp.admin(t).SubResource("token").Create(ctx, sa, req); err != nil {
		t.Fatalf("token of ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return req.Status.Token
}

func ptr[T any](v T) *T { return &v }

// servingCert returns a CA and a certificate for 127.0.0.1 it signed, with
// the certificate's key, all PEM.
func servingCert(t *testing.T) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "grid-e2e-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	caCert, _ := x509.ParseCertificate(caDER)
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// ecKeyPEM returns a new P-256 key, PEM: the ServiceAccount token signer
// (the API server reads the public key from the same file).
func ecKeyPEM(t *testing.T) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// TestControlPlaneStarts is the control plane alone: etcd, kube-apiserver,
// a ServiceAccount token, and RBAC refusing that account what no Role gives it.
func TestControlPlaneStarts(t *testing.T) {
	cp := startControlPlane(t)
	ctx := context.Background()
	cp.namespace(t, "probe")
	sa := &corev1.ServiceAccount{}
	sa.Namespace, sa.Name = "probe", "nobody"
	if err := cp.admin(t).Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	token := cp.serviceAccountToken(t, "probe", "nobody")
	var secrets corev1.SecretList
	err := cp.client(t, token).List(ctx, &secrets, client.InNamespace("probe"))
	if err == nil {
		t.Fatal("a ServiceAccount no Role names listed Secrets")
	}
	t.Log(err)
}
