package operator

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
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/signals"
)

// Poll outcomes, the `outcome` label of grid_peer_poll_total.
const (
	OutcomeOK          = "ok"
	OutcomeTimeout     = "timeout"
	OutcomeRefused     = "refused"
	OutcomeTLS         = "tls"
	OutcomeTransport   = "transport"
	OutcomeClientError = "client_error"
	OutcomeServerError = "server_error"
	OutcomeEncoding    = "encoding"
	OutcomeConfig      = "config"
	OutcomeCancelled   = "cancelled"
)

// Outcomes lists every outcome, for pre-created counters.
var Outcomes = []string{OutcomeOK, OutcomeTimeout, OutcomeRefused, OutcomeTLS, OutcomeTransport,
	OutcomeClientError, OutcomeServerError, OutcomeEncoding, OutcomeConfig, OutcomeCancelled}

// retryable are the transient outcomes worth another attempt.
func retryable(outcome string) bool {
	switch outcome {
	case OutcomeTimeout, OutcomeRefused, OutcomeTransport, OutcomeServerError:
		return true
	}
	return false
}

// pollError is a failed attempt with its outcome class.
type pollError struct {
	outcome string
	err     error
}

func (e *pollError) Error() string { return e.outcome + ": " + e.err.Error() }
func (e *pollError) Unwrap() error { return e.err }

// verifyError marks a failure of the SPIFFE verification of a peer's
// certificate, which crypto/tls passes up unwrapped.
type verifyError struct{ err error }

func (e *verifyError) Error() string { return e.err.Error() }
func (e *verifyError) Unwrap() error { return e.err }

// peerState is what the poller keeps about one peer between rounds.
type peerState struct {
	cfg    config.Peer
	client *http.Client
	// agesRejected is the PeerAgesRejected state: the peer's last answer
	// carried rows refused for age. Silence keeps it.
	agesRejected bool
}

// peerPoller polls every configured peer.
type peerPoller struct {
	o  *Operator
	mu sync.Mutex
	// peers by site name.
	peers map[string]*peerState
	// fences holds, per "peer/provider", the newest batch admitted: never
	// rolled back by a rejected payload.
	fences map[string]*signals.Fence
}

func newPeerPoller(o *Operator) *peerPoller {
	return &peerPoller{o: o, peers: map[string]*peerState{}, fences: map[string]*signals.Fence{}}
}

// configure sets the peer list: new peers get a client, removed ones are
// forgotten with their fences, rows and series.
func (pp *peerPoller) configure(peers []config.Peer) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	keep := map[string]bool{}
	for _, p := range peers {
		keep[p.Site] = true
		if cur, ok := pp.peers[p.Site]; ok && cur.cfg.Equal(p) {
			continue
		}
		pp.peers[p.Site] = &peerState{cfg: p, client: pp.newClient(p.Site)}
		pp.o.m.peers.initPeer(p.Site)
	}
	for site, ps := range pp.peers {
		if keep[site] {
			continue
		}
		if ps.client != nil {
			ps.client.CloseIdleConnections()
		}
		delete(pp.peers, site)
		for k := range pp.fences {
			if strings.HasPrefix(k, site+"/") {
				delete(pp.fences, k)
			}
		}
		pp.o.peerStore.Replace(site+"/", nil)
		pp.o.m.peers.forgetPeer(site)
	}
}

// newClient dials one peer: a fresh connection for every poll, so its chain
// is verified every time, and only that site's SPIFFE id is accepted.
func (pp *peerPoller) newClient(site string) *http.Client {
	conf, err := pp.o.id.ClientTLS(site)
	if err != nil {
		return nil // a config outcome at poll time
	}
	verify := conf.VerifyPeerCertificate
	conf.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		if err := verify(raw, chains); err != nil {
			return &verifyError{err}
		}
		return nil
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			TLSClientConfig:     conf,
			DisableKeepAlives:   true,
			TLSHandshakeTimeout: pp.o.cfg.Load().PeerPoll.Timeout.D(),
			DialContext:         pp.o.dial,
			ForceAttemptHTTP2:   false,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (pp *peerPoller) snapshot() []*peerState {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	out := make([]*peerState, 0, len(pp.peers))
	for _, p := range pp.peers {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].cfg.Site < out[j].cfg.Site })
	return out
}

// RunPeers polls every peer each peerPollInterval until ctx ends.
func (o *Operator) RunPeers(ctx context.Context) {
	every(ctx, o.clk, func() time.Duration { return o.cfg.Load().PeerPollInterval.D() }, func() { o.PollPeers(ctx) })
}

// PollPeers runs one round: every peer concurrently (bounded), each peer's
// rows published as soon as that peer completes.
func (o *Operator) PollPeers(ctx context.Context) {
	if o.poller == nil {
		return
	}
	forEachBounded(ctx, o.cfg.Load().PeerPoll.Concurrency, o.poller.snapshot(), func(ps *peerState) { o.poller.pollPeer(ctx, ps) })
}

// pollPeer polls one peer with retries inside its budget, then publishes.
func (pp *peerPoller) pollPeer(ctx context.Context, ps *peerState) {
	o := pp.o
	cfg := o.cfg.Load().PeerPoll
	site := ps.cfg.Site
	o.m.peers.inFlight.Inc()
	defer o.m.peers.inFlight.Dec()
	start := o.clk.Now()
	budgetCtx, cancel := context.WithTimeout(ctx, cfg.Budget.D())
	defer cancel()

	var (
		body    []byte
		date    time.Time
		outcome string
		err     error
	)
	for attempt := 0; attempt < cfg.Attempts; attempt++ {
		body, date, err = pp.attempt(budgetCtx, ps)
		outcome = classifyPoll(ctx, err)
		if outcome == OutcomeOK || !retryable(outcome) || attempt == cfg.Attempts-1 {
			break
		}
		delay := backoff(cfg.Backoff.D(), attempt, site)
		if dl, ok := budgetCtx.Deadline(); ok {
			delay = min(delay, time.Until(dl))
		}
		if delay <= 0 {
			break
		}
		o.m.peers.retries.WithLabelValues(site, outcome).Inc()
		if sleepCtx(budgetCtx, delay) != nil {
			break
		}
	}
	elapsed := o.clk.Now().Sub(start)
	o.m.peers.polls.WithLabelValues(site, outcome).Inc()
	o.m.peers.duration.WithLabelValues(site).Observe(elapsed.Seconds())
	if elapsed >= cfg.Slow.D() {
		o.m.peers.slow.WithLabelValues(site).Inc()
	}
	if outcome == OutcomeCancelled {
		return
	}
	if outcome != OutcomeOK {
		o.m.peers.up.WithLabelValues(site).Set(0)
		o.log.Debug("peer poll failed", "peer", site, "outcome", outcome, "err", err)
		return
	}
	o.m.peers.up.WithLabelValues(site).Set(1)
	o.m.peers.lastSuccess.WithLabelValues(site).Set(float64(o.clk.Now().UnixMilli()) / 1000)
	o.m.peers.bytes.WithLabelValues(site).Add(float64(len(body)))
	pp.ingest(ps, body, date)
}

// backoff is the delay before retry k (k = 0 for the first): the base
// doubled per retry up to 2^5, plus up to a quarter more, spread by the
// peer's name so peers do not retry in step (docs/protocol.md §4.7).
func backoff(base time.Duration, k int, site string) time.Duration {
	scaled := base * time.Duration(1<<min(k, 5))
	var spread uint32
	for i := 0; i < len(site); i++ {
		spread = spread*31 + uint32(site[i])
	}
	return scaled + (scaled/4)*time.Duration(spread%100)/100
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// attempt is one bounded GET of a peer's signals.
func (pp *peerPoller) attempt(ctx context.Context, ps *peerState) ([]byte, time.Time, error) {
	cfg := pp.o.cfg.Load().PeerPoll
	if ps.client == nil {
		return nil, time.Time{}, &pollError{OutcomeConfig, errors.New("no TLS configuration for this peer")}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout.D())
	defer cancel()
	url := strings.TrimRight(ps.cfg.Signals, "/") + signals.SignalsPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, time.Time{}, &pollError{OutcomeConfig, err}
	}
	resp, err := ps.client.Do(req)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500:
		return nil, time.Time{}, &pollError{OutcomeServerError, fmt.Errorf("HTTP %d", resp.StatusCode)}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, time.Time{}, &pollError{OutcomeClientError, fmt.Errorf("HTTP %d", resp.StatusCode)}
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, signals.MaxAnswerBytes+1)); err != nil {
		return nil, time.Time{}, err
	}
	if buf.Len() > signals.MaxAnswerBytes {
		return nil, time.Time{}, &pollError{OutcomeTransport, errors.New("answer exceeds 1 MiB")}
	}
	if !utf8.Valid(buf.Bytes()) {
		return nil, time.Time{}, &pollError{OutcomeEncoding, errors.New("answer is not UTF-8")}
	}
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return nil, time.Time{}, &pollError{OutcomeEncoding, fmt.Errorf("no usable Date header: %w", err)}
	}
	return buf.Bytes(), date, nil
}

// classifyPoll maps an attempt's error to its outcome.
func classifyPoll(parent context.Context, err error) string {
	var (
		pe     *pollError
		ve     *verifyError
		alert  tls.AlertError
		record tls.RecordHeaderError
		cve    *tls.CertificateVerificationError
		ne     net.Error
	)
	switch {
	case err == nil:
		return OutcomeOK
	case errors.As(err, &pe):
		return pe.outcome
	case parent.Err() != nil:
		return OutcomeCancelled
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return OutcomeTimeout
	case errors.As(err, &ve), errors.As(err, &alert), errors.As(err, &record), errors.As(err, &cve):
		return OutcomeTLS
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return OutcomeRefused
	case errors.As(err, &ne) && ne.Timeout():
		return OutcomeTimeout
	}
	return OutcomeTransport
}
