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
	cfg config.Peer
	// client polls the peer, made under identity generation clientGen
	// (nil before the first poll); both guarded by clientMu (its loop and
	// a PollPeers round may both poll). clientFor makes and replaces it.
	clientMu  sync.Mutex
	client    *http.Client
	clientGen uint64
	// agesRejected is the PeerAgesRejected state: the peer's last answer
	// carried rows refused for age. Silence keeps it.
	agesRejected bool
	// cursor is the peer's last long-poll cursor, "" when the next poll
	// is a plain one (the peer's loop only).
	cursor string
	// health is what the log last said of the peer's polls, guarded by
	// its mu: its loop and a PollPeers round may both poll it.
	health pollHealth
}

// pollHealth turns a peer's poll outcomes into the log an operator must
// act on: one WARN when its polls start failing, and again when they fail
// differently, one INFO when they succeed again; the rest is DEBUG.
type pollHealth struct {
	mu      sync.Mutex
	failing string // the outcome of the failing run; "" while polls succeed
	failed  int    // polls failed in the run
}

// observe records one poll's outcome and reports what to log: warn when a
// failing run starts or changes outcome, recovered (with the run's length)
// when a failing run ends.
func (h *pollHealth) observe(outcome string) (warn bool, recovered int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if outcome == OutcomeOK {
		recovered, h.failing, h.failed = h.failed, "", 0
		return false, recovered
	}
	warn = h.failing != outcome
	h.failing = outcome
	h.failed++
	return warn, 0
}

// streak is how many polls in a row have failed.
func (h *pollHealth) streak() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
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
		pp.peers[p.Site] = &peerState{cfg: p} // its client is made at its first poll (clientFor)
		pp.o.m.peers.initPeer(p.Site)
	}
	for site, ps := range pp.peers {
		if keep[site] {
			continue
		}
		ps.clientMu.Lock()
		if ps.client != nil {
			ps.client.CloseIdleConnections()
		}
		ps.clientMu.Unlock()
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

// newClient dials one peer, accepting only that site's SPIFFE id. It keeps
// one connection to the peer and reuses it poll after poll (the long poll
// holds it most of the time): the chain is verified when it is made, the
// peer's listener closes a connection after 300 s, so it is verified again
// at least that often, and a change of this site's certificate material
// (a rotated CA or certificate) makes the next poll dial afresh
// (clientFor).
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
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     2 * time.Minute,
			TLSHandshakeTimeout: pp.o.cfg.Load().PeerPoll.Timeout.D(),
			DialContext:         pp.o.dial,
			ForceAttemptHTTP2:   false,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// clientFor is ps's client, made at the peer's first poll and afresh when
// this site's certificate material has changed since (generation 0 is no
// identity, so no client): the old one's kept connection,
// verified under trust that may be gone, is closed. A poll still using it
// (a PollPeers round beside the peer's loop) finishes on it; that
// connection then idles in a transport nothing uses, closed after its
// IdleConnTimeout.
func (pp *peerPoller) clientFor(ps *peerState) *http.Client {
	ps.clientMu.Lock()
	defer ps.clientMu.Unlock()
	if gen := pp.o.idGeneration(); gen != ps.clientGen {
		if ps.client != nil {
			ps.client.CloseIdleConnections()
		}
		ps.client, ps.clientGen = pp.newClient(ps.cfg.Site), gen
	}
	return ps.client
}

// idGeneration is the identity's generation, 0 without one.
func (o *Operator) idGeneration() uint64 {
	if o.id == nil {
		return 0
	}
	return o.id.Generation()
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
//
// Each peer has a loop of its own (as a Prometheus scrape loop per target),
// started and stopped as the poll set changes. Against a peer that answers
// long polls, the loop waits at the peer for its rows to change, up to
// peerPollInterval, so a change at the peer is here as soon as it is
// published and a silent or hung peer is noticed as soon as with plain
// polls; against one that does not, it polls every peerPollInterval.
func (o *Operator) RunPeers(ctx context.Context) {
	if o.poller == nil {
		return
	}
	loops := map[*peerState]context.CancelFunc{}
	var wg sync.WaitGroup
	defer func() {
		for _, stop := range loops {
			stop()
		}
		wg.Wait()
	}()
	t := o.clk.NewTicker(time.Second)
	defer t.Stop()
	for {
		current := map[*peerState]bool{}
		for _, ps := range o.poller.snapshot() {
			current[ps] = true
			if loops[ps] == nil {
				lctx, stop := context.WithCancel(ctx)
				loops[ps] = stop
				wg.Add(1)
				go func() { defer wg.Done(); o.poller.loop(lctx, ps) }()
			}
		}
		for ps, stop := range loops {
			if !current[ps] {
				stop()
				delete(loops, ps)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// loop polls one peer until ctx ends: long polls while the peer gives
// cursors, plain polls every peerPollInterval otherwise, and after a
// failed poll sooner (retryGap).
func (pp *peerPoller) loop(ctx context.Context, ps *peerState) {
	for ctx.Err() == nil {
		start := pp.o.clk.Now()
		gap := pp.o.cfg.Load().PeerPollInterval.D()
		if pp.pollPeer(ctx, ps, true) {
			gap = minLongPollGap // the wait was at the peer
		} else if n := ps.health.streak(); n > 0 {
			gap = min(gap, retryGap(n))
		}
		if sleepCtx(ctx, gap-pp.o.clk.Now().Sub(start)) != nil {
			return
		}
	}
}

// retryGap is the wait after the nth failed poll in a row: 250 ms, then
// doubling (the loop caps it at peerPollInterval). When a grid starts,
// every operator's first polls of the peers that are not up yet fail;
// waiting a whole interval after them left each gateway, for those
// seconds, knowing only its own site, and it sent every request there.
func retryGap(n int) time.Duration {
	return 250 * time.Millisecond << min(n-1, 8)
}

// minLongPollGap spaces long polls, so a peer whose rows change many times
// a second is read in batches.
const minLongPollGap = 200 * time.Millisecond

// PollPeers runs one round: every peer concurrently (bounded), each peer's
// rows published as soon as that peer completes.
func (o *Operator) PollPeers(ctx context.Context) {
	if o.poller == nil {
		return
	}
	forEachBounded(ctx, o.cfg.Load().PeerPoll.Concurrency, o.poller.snapshot(), func(ps *peerState) { o.poller.pollPeer(ctx, ps, false) })
}

// pollPeer polls one peer with retries inside its budget, then publishes.
// With long set and a cursor from the peer's last answer, the poll is one
// long poll instead, waiting up to peerPollInterval at the peer; a failed
// one makes the next poll a plain one. It reports whether the peer's
// answer carried a cursor: the next poll may wait at the peer.
func (pp *peerPoller) pollPeer(ctx context.Context, ps *peerState, long bool) (waitNext bool) {
	o := pp.o
	cfg := o.cfg.Load().PeerPoll
	site := ps.cfg.Site
	o.m.peers.inFlight.Inc()
	defer o.m.peers.inFlight.Dec()
	start := o.clk.Now()
	var wait time.Duration
	attempts, budget := cfg.Attempts, cfg.Budget.D()
	if long && ps.cursor != "" {
		wait = o.cfg.Load().PeerPollInterval.D()
		attempts, budget = 1, wait+cfg.Timeout.D()
	}
	budgetCtx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()

	var (
		body    []byte
		date    time.Time
		cursor  string
		outcome string
		err     error
	)
	for attempt := 0; attempt < attempts; attempt++ {
		body, date, cursor, err = pp.attempt(budgetCtx, ps, wait)
		outcome = classifyPoll(ctx, err)
		if outcome == OutcomeOK || !retryable(outcome) || attempt == attempts-1 {
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
	if elapsed-wait >= cfg.Slow.D() {
		o.m.peers.slow.WithLabelValues(site).Inc()
	}
	if outcome == OutcomeCancelled {
		return false
	}
	if outcome != OutcomeOK {
		if long {
			ps.cursor = ""
		}
		o.m.peers.up.WithLabelValues(site).Set(0)
		if warn, _ := ps.health.observe(outcome); warn {
			o.log.Warn("cannot poll peer; its rows age until they expire", "peer", site, "signals", ps.cfg.Signals, "outcome", outcome, "err", err)
		} else {
			o.log.Debug("peer poll failed", "peer", site, "outcome", outcome, "err", err)
		}
		return false
	}
	if _, recovered := ps.health.observe(OutcomeOK); recovered > 0 {
		o.log.Info("peer polled again", "peer", site, "failed_polls", recovered)
	}
	if long {
		ps.cursor = cursor
	}
	o.m.peers.up.WithLabelValues(site).Set(1)
	o.m.peers.lastSuccess.WithLabelValues(site).Set(float64(o.clk.Now().UnixMilli()) / 1000)
	o.m.peers.bytes.WithLabelValues(site).Add(float64(len(body)))
	pp.ingest(ps, body, date)
	return cursor != ""
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

// attempt is one bounded GET of a peer's signals; with wait, a long poll
// on the peer's last cursor. It returns the answer's cursor too.
func (pp *peerPoller) attempt(ctx context.Context, ps *peerState, wait time.Duration) ([]byte, time.Time, string, error) {
	cfg := pp.o.cfg.Load().PeerPoll
	client := pp.clientFor(ps)
	if client == nil {
		return nil, time.Time{}, "", &pollError{OutcomeConfig, errors.New("no TLS configuration for this peer")}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout.D()+wait)
	defer cancel()
	url := strings.TrimRight(ps.cfg.Signals, "/") + signals.SignalsPath
	if wait > 0 {
		url += "?" + signals.WaitParam + "=" + wait.String() + "&" + signals.SinceParam + "=" + ps.cursor
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, time.Time{}, "", &pollError{OutcomeConfig, err}
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, time.Time{}, "", err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500:
		return nil, time.Time{}, "", &pollError{OutcomeServerError, fmt.Errorf("HTTP %d", resp.StatusCode)}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, time.Time{}, "", &pollError{OutcomeClientError, fmt.Errorf("HTTP %d", resp.StatusCode)}
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, signals.MaxAnswerBytes+1)); err != nil {
		return nil, time.Time{}, "", err
	}
	if buf.Len() > signals.MaxAnswerBytes {
		return nil, time.Time{}, "", &pollError{OutcomeTransport, errors.New("answer exceeds 1 MiB")}
	}
	if !utf8.Valid(buf.Bytes()) {
		return nil, time.Time{}, "", &pollError{OutcomeEncoding, errors.New("answer is not UTF-8")}
	}
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return nil, time.Time{}, "", &pollError{OutcomeEncoding, fmt.Errorf("no usable Date header: %w", err)}
	}
	return buf.Bytes(), date, resp.Header.Get(signals.CursorHeader), nil
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
