package identity

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
)

// Source is a site's identity read from PEM files: its SVID (certificate
// chain and key) and the grid CA bundle. It implements go-spiffe's
// x509svid.Source and x509bundle.Source, so TLS configurations built on it
// pick up renewed files for new connections without a restart.
type Source struct {
	files config.TLS
	id    spiffeid.ID
	td    spiffeid.TrustDomain
	clk   clock.Clock
	log   *slog.Logger

	mu       sync.RWMutex
	svid     *x509svid.SVID
	bundle   *x509bundle.Bundle
	raw      []byte // the files' bytes as last loaded, to see changes
	current  [32]byte
	previous *previousLeaf

	// lastForced is when (unix ns) an unknown leaf for this site last made
	// the files be re-read.
	lastForced atomic.Int64
	// generation counts the material applied (the first load is 1): a
	// connection made under an older generation was verified with trust
	// that may be gone.
	generation atomic.Uint64
}

// Generation is how many times certificate material has been applied; it
// moves when the CA bundle or this site's certificate changes, so a holder
// of kept-alive connections knows to dial afresh.
func (s *Source) Generation() uint64 { return s.generation.Load() }

// forcedReloadEvery bounds how often callers presenting an unknown leaf for
// this site can make the files be re-read.
const forcedReloadEvery = time.Second

// previousLeaf is the leaf a renewal replaced: it still counts as this
// site's own until it expires, so a gateway that has not reloaded yet keeps
// its Local access.
type previousLeaf struct {
	sum      [32]byte
	notAfter time.Time
}

// LoadSource reads the files and checks them: the key matches, the leaf
// carries exactly one URI SAN naming this site, and it chains to the CA.
func LoadSource(files config.TLS, trustDomain, site string, clk clock.Clock, log *slog.Logger) (*Source, error) {
	id, err := SiteID(trustDomain, site)
	if err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.Real{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, id: id, td: id.TrustDomain(), clk: clk, log: log}
	if _, err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// ID is this site's SPIFFE id.
func (s *Source) ID() spiffeid.ID { return s.id }

// TrustDomain is the grid's trust domain.
func (s *Source) TrustDomain() spiffeid.TrustDomain { return s.td }

// Reload re-reads the files. A change is applied only when the new material
// is whole and valid; otherwise the old identity stays and the error is
// returned. changed reports whether new material was applied.
func (s *Source) Reload() (changed bool, err error) {
	raw, err := s.readAll()
	if err != nil {
		return false, err
	}
	s.mu.RLock()
	same := bytes.Equal(raw, s.raw)
	s.mu.RUnlock()
	if same {
		return false, nil
	}
	svid, err := s.loadSVID()
	if err != nil {
		return false, err
	}
	if svid.ID != s.id {
		return false, fmt.Errorf("%s: certificate %s names %s, but this is %s", s.where(certFile), s.files.Cert, svid.ID, s.id)
	}
	bundle, err := x509bundle.Load(s.td, s.files.CA)
	if err != nil {
		return false, fmt.Errorf("%s: load grid CA %s: %w", s.where(caFile), s.files.CA, err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		return false, fmt.Errorf("%s: certificate %s does not chain to the grid CA %s (%s): %w", s.where(certFile), s.files.Cert, s.files.CA, s.where(caFile), err)
	}
	sum := sha256.Sum256(svid.Certificates[0].Raw)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.svid != nil && sum != s.current {
		s.previous = &previousLeaf{sum: s.current, notAfter: s.svid.Certificates[0].NotAfter}
	}
	s.svid, s.bundle, s.raw, s.current = svid, bundle, raw, sum
	s.generation.Add(1)
	return true, nil
}

func (s *Source) readAll() ([]byte, error) {
	var all []byte
	for _, f := range []struct {
		which tlsFile
		path  string
	}{{caFile, s.files.CA}, {certFile, s.files.Cert}, {keyFile, s.files.Key}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("%s: read identity: %w", s.where(f.which), err)
		}
		all = append(all, b...)
		all = append(all, 0)
	}
	return all, nil
}

// loadSVID reads the certificate and its key, with an error naming the
// configuration key (and line) of the file at fault, and both files when
// the key is not the certificate's.
func (s *Source) loadSVID() (*x509svid.SVID, error) {
	cert, err := os.ReadFile(s.files.Cert)
	if err != nil {
		return nil, fmt.Errorf("%s: read site certificate: %w", s.where(certFile), err)
	}
	key, err := os.ReadFile(s.files.Key)
	if err != nil {
		return nil, fmt.Errorf("%s: read site key: %w", s.where(keyFile), err)
	}
	svid, err := x509svid.Parse(cert, key)
	if err == nil {
		return svid, nil
	}
	// x509svid says which part failed only in its message.
	switch msg := err.Error(); {
	case strings.Contains(msg, "does not match private key"):
		return nil, fmt.Errorf("%s: the key %s is not the key of the certificate %s (%s)", s.where(keyFile), s.files.Key, s.files.Cert, s.where(certFile))
	case strings.Contains(msg, "private key"):
		return nil, fmt.Errorf("%s: load site key %s: %w", s.where(keyFile), s.files.Key, err)
	default:
		return nil, fmt.Errorf("%s: load site certificate %s: %w", s.where(certFile), s.files.Cert, err)
	}
}

// tlsFile is one of the three files of a TLS block.
type tlsFile uint8

const (
	caFile tlsFile = iota
	certFile
	keyFile
)

// where names the configuration key of one of the files, with its line
// when the configuration came from a file ("tls.cert at east.yaml:4").
func (s *Source) where(f tlsFile) string {
	key, at := "ca", s.files.At.CA
	switch f {
	case certFile:
		key, at = "cert", s.files.At.Cert
	case keyFile:
		key, at = "key", s.files.At.Key
	}
	if at == "" {
		return "tls." + key
	}
	return at
}

// Run re-reads the files every interval until ctx ends. A failed read keeps
// the current identity and is logged.
func (s *Source) Run(ctx context.Context, interval time.Duration) {
	t := s.clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		changed, err := s.Reload()
		switch {
		case err != nil:
			s.log.Warn("identity reload failed; keeping the current certificate", "err", err)
		case changed:
			s.log.Info("identity reloaded", "id", s.id.String(), "not_after", s.Expiry())
		}
	}
}

// GetX509SVID implements x509svid.Source.
func (s *Source) GetX509SVID() (*x509svid.SVID, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.svid, nil
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (s *Source) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != s.td {
		return nil, fmt.Errorf("no bundle for trust domain %s", td)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.bundle, nil
}

// ExpiryGauge is grid_site_identity_expiry_timestamp_seconds, read at
// scrape time so a renewal shows without a restart; operators and gateways
// both export it.
func (s *Source) ExpiryGauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "grid_site_identity_expiry_timestamp_seconds", Help: "Unix time the site certificate in use expires."},
		func() float64 { return float64(s.Expiry().Unix()) })
}

// Expiry is when the current certificate expires.
func (s *Source) Expiry() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.svid.Certificates[0].NotAfter
}

// IsOwnLeaf reports whether cert is this site's current leaf, or the one a
// renewal replaced while it has not expired.
func (s *Source) IsOwnLeaf(cert *x509.Certificate) bool {
	sum := sha256.Sum256(cert.Raw)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if sum == s.current {
		return true
	}
	return s.previous != nil && sum == s.previous.sum && s.clk.Now().Before(s.previous.notAfter)
}

// ServerTLS is the configuration of an mTLS listener: TLS 1.3 only, a client
// certificate required, chained to the grid CA and carrying a SPIFFE id of
// the trust domain. Which caller it is, is decided per request (Classify).
func (s *Source) ServerTLS() *tls.Config {
	c := tlsconfig.MTLSServerConfig(s, s, tlsconfig.AuthorizeMemberOf(s.td))
	c.MinVersion = tls.VersionTLS13
	return c
}

// ClientTLS is the configuration for dialling site: the server's chain must
// verify against the grid CA and its SPIFFE id must be exactly that site's,
// whatever name was dialled. Session resumption stays off, so every
// connection verifies the chain.
func (s *Source) ClientTLS(site string) (*tls.Config, error) {
	want, err := SiteID(s.td.Name(), site)
	if err != nil {
		return nil, err
	}
	c := tlsconfig.MTLSClientConfig(s, s, tlsconfig.AuthorizeID(want))
	c.MinVersion = tls.VersionTLS13
	c.ClientSessionCache = nil
	return c, nil
}

// CallerClass is who is on the other end of a verified connection.
type CallerClass int

// Caller classes (docs/protocol.md §2.1).
const (
	// Refused is anything that is neither this site nor a site.
	Refused CallerClass = iota
	// Local is this site's own certificate: its gateway.
	Local
	// Peer is another site of the grid.
	Peer
)

// Caller is a classified client.
type Caller struct {
	Class CallerClass
	// Site is the peer's site name, for Peer.
	Site string
}

// Classify decides the caller from a verified connection's leaf. A leaf that
// names this site but is neither its current nor its previous certificate is
// refused: holding a certificate for a site is not enough to read as it.
func (s *Source) Classify(cs *tls.ConnectionState) Caller {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return Caller{}
	}
	leaf := cs.PeerCertificates[0]
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return Caller{}
	}
	if id == s.id {
		if s.IsOwnLeaf(leaf) || (s.reloadForUnknownLeaf() && s.IsOwnLeaf(leaf)) {
			return Caller{Class: Local}
		}
		return Caller{}
	}
	site, err := SiteOf(id, s.td)
	if err != nil {
		return Caller{}
	}
	return Caller{Class: Peer, Site: site}
}

// reloadForUnknownLeaf re-reads the files when a caller presents a leaf
// for this site that is not known: during a renewal the site's gateway may
// pick up the new certificate before this process's next periodic reload,
// and its polls must not be refused meanwhile. At most once per
// forcedReloadEvery, so that a stranger holding a certificate for this site
// cannot make it read files on every connection. It reports whether the
// identity changed.
func (s *Source) reloadForUnknownLeaf() bool {
	now, last := s.clk.Now().UnixNano(), s.lastForced.Load()
	if now-last < int64(forcedReloadEvery) || !s.lastForced.CompareAndSwap(last, now) {
		return false
	}
	changed, err := s.Reload()
	if err != nil {
		s.log.Warn("identity reload for an unknown leaf of this site failed", "err", err)
	}
	if changed {
		s.log.Info("identity reloaded: a caller presented the renewed certificate first", "id", s.id.String())
	}
	return changed
}

// VerifiedSite returns the site a verified server presented, for a client
// that must key what it reads on that identity.
func VerifiedSite(cs *tls.ConnectionState, td spiffeid.TrustDomain) (string, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return "", errors.New("no peer certificate")
	}
	id, err := x509svid.IDFromCert(cs.PeerCertificates[0])
	if err != nil {
		return "", err
	}
	return SiteOf(id, td)
}
