// Package identity holds a grid's identities: the grid CA, SPIFFE site
// certificates (spiffe://<trust-domain>/site/<name>), loading and reloading
// them from files, and the mutual-TLS configurations that check them. SPIFFE
// IDs are parsed and verified with go-spiffe, never by string surgery.
package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/grid-inference/grid/internal/signals"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Validity of what Init and Issue create (docs/protocol.md §3.1).
const (
	caValidity   = 3650 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	backdate     = time.Hour // tolerate clocks a little behind the issuer
)

// SiteID is the SPIFFE id of a site.
func SiteID(trustDomain, site string) (spiffeid.ID, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	if !signals.IsDNS1123Label(site) {
		return spiffeid.ID{}, fmt.Errorf("site name %q is not a DNS-1123 label", site)
	}
	return spiffeid.FromSegments(td, "site", site)
}

// SiteOf returns the site an id names: spiffe://<td>/site/<name> with name a
// DNS-1123 label in the expected trust domain.
func SiteOf(id spiffeid.ID, td spiffeid.TrustDomain) (string, error) {
	if !id.MemberOf(td) {
		return "", fmt.Errorf("%s is not in trust domain %s", id, td)
	}
	var site string
	if id.Path() != "" {
		dir, name := filepath.Split(id.Path())
		if dir == "/site/" {
			site = name
		}
	}
	if !signals.IsDNS1123Label(site) {
		return "", fmt.Errorf("%s does not name a site (spiffe://%s/site/<name>)", id, td)
	}
	return site, nil
}

// Files names where a CA directory keeps its material.
func caFiles(dir string) (crt, key string) {
	return filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
}

// SiteFiles returns the certificate and key paths Issue writes for a site.
func SiteFiles(dir, site string) (crt, key string) {
	return filepath.Join(dir, site+".crt"), filepath.Join(dir, site+".key")
}

// Init creates a grid CA in dir: ca.crt and ca.key (0600). It refuses to
// overwrite an existing CA, which would orphan every certificate it issued.
func Init(dir, trustDomain string, now time.Time) error {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	crtFile, keyFile := caFiles(dir)
	if _, err := os.Stat(crtFile); err == nil {
		return fmt.Errorf("%s exists; refusing to replace a CA (remove it first if you mean to)", crtFile)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "grid CA " + td.Name(), Organization: []string{"grid"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		URIs:                  []*url.URL{td.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeKey(keyFile, key); err != nil {
		return err
	}
	return writePEM(crtFile, "CERTIFICATE", der, 0o644)
}

// Issue creates a site certificate signed by dir's CA: NAME.crt and NAME.key
// with exactly one URI SAN, spiffe://<td>/site/<site>, and the DNS SAN
// <site>.<td> plus any extra names. The trust domain is the CA's.
func Issue(dir, site string, extraDNS []string, now time.Time) error {
	if !signals.IsDNS1123Label(site) {
		return fmt.Errorf("site name %q is not a DNS-1123 label (1-63 characters of a-z, 0-9 and '-', alphanumeric at both ends)", site)
	}
	ca, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	caID, err := x509svidID(ca)
	if err != nil {
		return fmt.Errorf("CA %s: %w", dir, err)
	}
	id, err := SiteID(caID.TrustDomain().Name(), site)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: site, Organization: []string{site}},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id.URL()},
		DNSNames:     append([]string{site + "." + caID.TrustDomain().Name()}, extraDNS...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	crtFile, keyFile := SiteFiles(dir, site)
	if err := writeKey(keyFile, key); err != nil {
		return err
	}
	return writePEM(crtFile, "CERTIFICATE", der, 0o644)
}

func x509svidID(ca *x509.Certificate) (spiffeid.ID, error) {
	if len(ca.URIs) != 1 {
		return spiffeid.ID{}, errors.New("the CA carries no trust-domain URI SAN")
	}
	return spiffeid.FromURI(ca.URIs[0])
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtFile, keyFile := caFiles(dir)
	crtPEM, err := os.ReadFile(crtFile)
	if err != nil {
		return nil, nil, fmt.Errorf("read CA (run `grid certs init` first): %w", err)
	}
	block, _ := pem.Decode(crtPEM)
	if block == nil {
		return nil, nil, fmt.Errorf("%s: no PEM certificate", crtFile)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", crtFile, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("read CA key: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, fmt.Errorf("%s: no PEM key", keyFile)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not an ECDSA key", keyFile)
	}
	return ca, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}

func writeKey(file string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(file, "PRIVATE KEY", der, 0o600)
}

// writePEM writes atomically, so a reader never sees half a certificate.
func writePEM(file, typ string, der []byte, mode os.FileMode) error {
	tmp := file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
