package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/grid-inference/grid/internal/config"
)

// grid makes a CA in a temp dir and issues the named sites.
func grid(t *testing.T, sites ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := Init(dir, "grid.internal", time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, s := range sites {
		if err := Issue(dir, s, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func files(dir, site string) config.TLS {
	crt, key := SiteFiles(dir, site)
	return config.TLS{CA: filepath.Join(dir, "ca.crt"), Cert: crt, Key: key}
}

func source(t *testing.T, dir, site string) *Source {
	t.Helper()
	s, err := LoadSource(files(dir, site), "grid.internal", site, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIssuedCertificate(t *testing.T) {
	dir := grid(t)
	if err := Issue(dir, "east", []string{"grid-operator.grid.svc"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	crt, key := SiteFiles(dir, "east")
	c := readCert(t, crt)
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://grid.internal/site/east" {
		t.Errorf("URI SANs %v", c.URIs)
	}
	if len(c.DNSNames) != 2 || c.DNSNames[0] != "east.grid.internal" || c.DNSNames[1] != "grid-operator.grid.svc" {
		t.Errorf("DNS SANs %v", c.DNSNames)
	}
	for _, f := range []string{key, filepath.Join(dir, "ca.key")} {
		st, _ := os.Stat(f)
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v", f, st.Mode().Perm())
		}
	}
	if d := time.Until(c.NotAfter); d < 364*24*time.Hour || d > 366*24*time.Hour {
		t.Errorf("validity ends in %v", d)
	}
}

func TestIssueRefusals(t *testing.T) {
	dir := grid(t)
	for _, bad := range []string{"East", "east_1", "", "-east", strings.Repeat("a", 64), "a/b"} {
		if err := Issue(dir, bad, nil, time.Now()); err == nil || !strings.Contains(err.Error(), "DNS-1123") {
			t.Errorf("Issue(%q): %v", bad, err)
		}
	}
	if err := Init(dir, "grid.internal", time.Now()); err == nil {
		t.Error("Init replaced an existing CA")
	}
	if err := Issue(t.TempDir(), "east", nil, time.Now()); err == nil || !strings.Contains(err.Error(), "grid certs init") {
		t.Errorf("Issue without a CA: %v", err)
	}
}

func TestLoadSourceChecks(t *testing.T) {
	dir := grid(t, "east", "west")
	// A certificate of another site is refused as this site's.
	f := files(dir, "west")
	if _, err := LoadSource(f, "grid.internal", "east", nil, nil); err == nil || !strings.Contains(err.Error(), "names spiffe://grid.internal/site/west") {
		t.Errorf("west's cert as east: %v", err)
	}
	// A certificate from another CA does not chain.
	other := grid(t, "east")
	f = files(dir, "east")
	f.Cert, f.Key = SiteFiles(other, "east")
	if _, err := LoadSource(f, "grid.internal", "east", nil, nil); err == nil || !strings.Contains(err.Error(), "does not chain") {
		t.Errorf("foreign cert: %v", err)
	}
}

func TestSiteOf(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("grid.internal")
	for _, tc := range []struct {
		id, site string
		ok       bool
	}{
		{"spiffe://grid.internal/site/east", "east", true},
		{"spiffe://grid.internal/site/east/extra", "", false},
		{"spiffe://grid.internal/workload/east", "", false},
		{"spiffe://other.domain/site/east", "", false},
		{"spiffe://grid.internal", "", false},
	} {
		id := spiffeid.RequireFromString(tc.id)
		site, err := SiteOf(id, td)
		if (err == nil) != tc.ok || site != tc.site {
			t.Errorf("SiteOf(%s) = %q, %v", tc.id, site, err)
		}
	}
}

// handshake dials a server with the given client config and returns how the
// server classified the caller, or the handshake error.
func handshake(t *testing.T, server *Source, client *tls.Config) (Caller, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan Caller, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- Caller{}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.HandshakeContext(context.Background()); err != nil {
			got <- Caller{}
			return
		}
		cs := tc.ConnectionState()
		got <- server.Classify(&cs)
		io.Copy(io.Discard, c)
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err != nil {
		<-got
		return Caller{}, err
	}
	// TLS 1.3 client certificates are checked after the client's handshake
	// completes; a read surfaces a rejection.
	conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var buf [1]byte
	_, rerr := conn.Read(buf[:])
	conn.Close()
	c := <-got
	var ne net.Error
	if rerr != nil && !(errors.As(rerr, &ne) && ne.Timeout()) && !errors.Is(rerr, io.EOF) {
		return c, rerr
	}
	return c, nil
}

func TestCallerClasses(t *testing.T) {
	dir := grid(t, "east", "west", "north")
	east, west := source(t, dir, "east"), source(t, dir, "west")

	c, _ := east.ClientTLS("east")
	if got, err := handshake(t, east, c); err != nil || got.Class != Local {
		t.Errorf("east's own cert: %+v %v", got, err)
	}
	c, _ = west.ClientTLS("east")
	if got, err := handshake(t, east, c); err != nil || got.Class != Peer || got.Site != "west" {
		t.Errorf("west: %+v %v", got, err)
	}
	// Another CA's east cert fails the handshake.
	foreign := source(t, grid(t, "east"), "east")
	c, _ = foreign.ClientTLS("east")
	if _, err := handshake(t, east, c); err == nil {
		t.Error("a foreign CA's certificate was accepted")
	}
	// No client certificate fails the handshake.
	noCert, _ := west.ClientTLS("east")
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	if _, err := handshake(t, east, noCert); err == nil {
		t.Error("a client without a certificate was accepted")
	}
	// A second certificate for east, not east's own leaf, is refused.
	other := t.TempDir()
	copyFile(t, filepath.Join(dir, "ca.crt"), filepath.Join(other, "ca.crt"))
	copyFile(t, filepath.Join(dir, "ca.key"), filepath.Join(other, "ca.key"))
	Issue(other, "east", nil, time.Now())
	twin := source(t, other, "east")
	c, _ = twin.ClientTLS("east")
	if got, err := handshake(t, east, c); err != nil || got.Class != Refused {
		t.Errorf("a twin east certificate: %+v %v", got, err)
	}
}

func TestClientRefusesImpostor(t *testing.T) {
	dir := grid(t, "east", "north")
	east, north := source(t, dir, "east"), source(t, dir, "north")
	// east dials "west", but a valid grid server of site north answers.
	c, err := east.ClientTLS("west")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, north, c); err == nil {
		t.Fatal("east accepted north answering as west")
	}
}

func TestRotationKeepsPreviousLeaf(t *testing.T) {
	dir := grid(t, "east")
	east := source(t, dir, "east")
	crt, _ := SiteFiles(dir, "east")
	old := readCert(t, crt)
	if changed, err := east.Reload(); changed || err != nil {
		t.Fatalf("reload without a change: %v %v", changed, err)
	}
	Issue(dir, "east", nil, time.Now())
	if changed, err := east.Reload(); !changed || err != nil {
		t.Fatalf("reload after renewal: %v %v", changed, err)
	}
	if !east.IsOwnLeaf(readCert(t, crt)) || !east.IsOwnLeaf(old) {
		t.Error("the new or the previous leaf is not counted as own")
	}
	// A broken file is not applied: the identity stays.
	os.WriteFile(crt, []byte("garbage"), 0o644)
	if _, err := east.Reload(); err == nil {
		t.Error("garbage certificate applied")
	}
	if east.Expiry().IsZero() {
		t.Error("identity lost")
	}
}

// TestRenewedLeafBeforeReload: the site's gateway picks up a renewed
// certificate before the operator's periodic reload; the operator re-reads
// its files on the spot and admits it as Local, at most once a second.
func TestRenewedLeafBeforeReload(t *testing.T) {
	dir := grid(t, "east")
	operator := source(t, dir, "east")
	Issue(dir, "east", nil, time.Now())
	gateway := source(t, dir, "east") // has the renewed leaf; the operator has not reloaded
	c, _ := gateway.ClientTLS("east")
	if got, err := handshake(t, operator, c); err != nil || got.Class != Local {
		t.Fatalf("the renewed leaf before the operator's reload: %+v %v", got, err)
	}
	// A third leaf within the second is not looked for again: refused.
	Issue(dir, "east", nil, time.Now())
	third := source(t, dir, "east")
	c, _ = third.ClientTLS("east")
	if got, err := handshake(t, operator, c); err != nil || got.Class != Refused {
		t.Errorf("a second unknown leaf within a second: %+v %v", got, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(to, b, 0o600)
}
