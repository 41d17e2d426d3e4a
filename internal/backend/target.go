package backend

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/grid-inference/grid/internal/config"
)

// BodyCap is the most of a response body a scrape reads.
const BodyCap = 1 << 20

// Accept asks Python exporters for the classic text format, which keeps
// colon names and their TYPE lines (prometheus_client >= 0.23 escapes names
// for an OpenMetrics Accept without escaping=allow-utf-8).
const Accept = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// Target is one provider as the scraper reaches it. Build it with NewTarget;
// it owns a keep-alive HTTP client, so reuse it across scrapes and Close it
// when the provider goes away.
type Target struct {
	Name       string
	Kind       string
	PoolName   string
	MetricsURL string
	LoadsURL   string
	Timeout    time.Duration
	tokenFile  string
	client     *http.Client
	// configErr, when set, fails every scrape with class config: a target
	// whose TLS cannot be built is never scraped in plaintext instead.
	configErr error
}

// LoadsQuery is what the probe asks /v1/loads for.
const LoadsQuery = "include=core,queues,disagg"

// NewTarget builds a target from a provider's configuration.
func NewTarget(p *config.Provider) *Target {
	base := strings.TrimRight(p.Metrics.Endpoint, "/")
	path := p.Metrics.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	t := &Target{
		Name: p.Name, Kind: p.Kind, PoolName: p.Metrics.PoolName,
		MetricsURL: base + path,
		LoadsURL:   base + "/v1/loads?" + LoadsQuery,
		Timeout:    p.Metrics.Timeout.D(),
		tokenFile:  p.Metrics.BearerTokenFile,
	}
	tlsConf, err := clientTLS(p.Metrics.TLS)
	if err != nil {
		t.configErr = fmt.Errorf("provider %s metrics TLS: %w", p.Name, err)
	}
	t.client = &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil, // scrapes go straight to the backend
			DialContext:           (&net.Dialer{Timeout: t.Timeout, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:       tlsConf,
			TLSHandshakeTimeout:   t.Timeout,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: t.Timeout,
		},
		// A redirect would move the scrape somewhere the configuration did
		// not name.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return t
}

// Close releases the target's idle connections.
func (t *Target) Close() { t.client.CloseIdleConnections() }

func clientTLS(c *config.ClientTLS) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c == nil {
		return conf, nil
	}
	conf.ServerName = c.ServerName
	conf.InsecureSkipVerify = c.InsecureSkipVerify
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificates", c.CA)
		}
		conf.RootCAs = pool
	}
	if c.Cert != "" {
		cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, err
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// response is one bounded GET.
type response struct {
	status int
	body   []byte
	capped bool // the body reached BodyCap; body holds the first BodyCap bytes
}

// get fetches url within the target's timeout, reading at most BodyCap bytes.
// Transport failures come back classified.
func (t *Target) get(ctx context.Context, url, accept string) (*response, error) {
	if t.configErr != nil {
		return nil, &Error{ClassConfig, t.configErr}
	}
	ctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, &Error{ClassConfig, err}
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", "grid-operator")
	if t.tokenFile != "" {
		tok, err := os.ReadFile(t.tokenFile)
		if err != nil {
			return nil, &Error{ClassConfig, fmt.Errorf("bearer token: %w", err)}
		}
		req.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(tok)))
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, &Error{classify(err), err}
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, BodyCap+1))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, &Error{classify(err), fmt.Errorf("read body: %w", err)}
	}
	r := &response{status: resp.StatusCode, body: buf.Bytes()}
	if n > BodyCap {
		r.capped, r.body = true, r.body[:BodyCap]
	}
	return r, nil
}

// statusError classifies a non-2xx answer.
func statusError(url string, status int) error {
	class := ClassHTTP
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		class = ClassUnauthorized
	}
	return &Error{class, fmt.Errorf("GET %s: HTTP %d", url, status)}
}
