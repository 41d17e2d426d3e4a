// Package gateway is the site gateway: an OpenAI-compatible reverse proxy
// that polls its local operator while it serves, keeps the readings in a
// load store, rebuilds a routing snapshot after every poll, and picks a site
// for each request from that snapshot alone. Requests for a remote site go
// to that site's gateway over mutual TLS (the hop listener), which routes
// them among its own providers.
package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grid-inference/grid/internal/affinity"
	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/connlimit"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/signals"
	"github.com/prometheus/client_golang/prometheus"
)

// Bounds of the operator exchange.
const (
	pollTimeout = 2 * time.Second
	// warnEvery spaces the WARNs of an operator that stays unreadable.
	warnEvery = 30 * time.Second
	// maxRelayPages bounds the pages of one poll cycle: the store's key
	// cap fits in well under it.
	maxRelayPages = 16
	// storeWindow is how long the store keeps samples (the reference's
	// window_secs).
	storeWindow = 60 * time.Second
)

// Options are the gateway's collaborators.
type Options struct {
	Clock    clock.Clock
	Logger   *slog.Logger
	Identity *identity.Source
}

// Gateway is one site's gateway. Its fields are grouped by who may touch
// them.
type Gateway struct {
	// Set by New and never replaced; each is safe for any goroutine (the
	// store, builder, budget, history, health, session table, stream set
	// and service estimate synchronise themselves).
	clk      clock.Clock
	log      *slog.Logger
	id       *identity.Source
	m        *metrics
	opClient *http.Client
	timeline *loadstore.Timeline
	store    *loadstore.Store
	builder  *route.Builder
	// bodies bounds the request bodies held in memory (limits.bodyBytes).
	bodies *bodyBudget
	// hist is the dashboard's history (history.go).
	hist      *history
	health    *health
	upstreams *upstreams
	rep       *reporter
	picks     picks
	// service is what this gateway observed of its requests' service, the
	// unit the age-aware policy reads ages in (docs/routing.md): the
	// request path writes it, the snapshot rebuild reads it.
	service  *route.Service
	sessions *affinity.Table // session affinity's bindings (affinity.go)
	// streams are the SSE answers copied off the server's goroutines
	// (detach.go).
	streams *streamSet
	// holds are the requests held while the grid is full (hold.go).
	holds holdRoom
	// stopping is done, with cause errShutdown, once a drain ran out of
	// time (InterruptStreams): the streams the servers copy themselves end
	// with the terminal event. interrupt ends it; any goroutine.
	stopping  context.Context
	interrupt context.CancelCauseFunc
	// costs observe requests' estimated sizes (cost.go); set in New.
	costs costObservers
	// closingConns is set by LameDuck: every answer on the client
	// listener closes its connection. Any goroutine.
	closingConns atomic.Bool
	// clientActive counts the requests the client listener's handler is
	// answering (QuietClients). Any goroutine.
	clientActive atomic.Int64
	// wake asks the poll loop to poll (a request after an idle spell);
	// ejected asks it for a rebuild after a passive-health ejection; first
	// is closed after the first successful poll (firstOnce).
	wake      chan struct{}
	ejected   chan struct{}
	first     chan struct{}
	firstOnce sync.Once

	// Swapped atomically, read by any goroutine.
	cfg     atomic.Pointer[config.Gateway]
	serving atomic.Pointer[signals.Serving]
	// local is the hop view: this site's own candidates only.
	local atomic.Pointer[route.Snapshot]
	// guards are the listeners' connection caps, and rejoin the client
	// listener detached streams' connections return through; set by Guard.
	guards [numListeners]atomic.Pointer[connlimit.Listener]
	rejoin atomic.Pointer[rejoinListener]
	turn   atomic.Uint64
	// lastRequest is the unix ns of the latest request (or of the start);
	// lastRead of the latest successful poll, 0 before one.
	lastRequest atomic.Int64
	lastRead    atomic.Int64
	// cursor is the last answer's long-poll cursor (nil: read plainly).
	cursor atomic.Pointer[string]
	// waitingSince is the unix ns a long poll now waiting at the operator
	// was sent, 0 when none waits: while the operator holds it, it answers
	// on change, so the board is as fresh as what the operator holds.
	waitingSince atomic.Int64
	// pollDone is closed, and replaced, at the end of every poll cycle.
	pollDone atomic.Pointer[chan struct{}]

	// refreshMu serialises refreshes: the poll loop's, and a request's
	// that found the snapshot too old after a failed wake poll.
	refreshMu sync.Mutex
	// modelsSeen maps each model a snapshot has held to the unix seconds
	// it was first seen, /v1/models' "created"; written under refreshMu,
	// swapped whole so requests read it without a lock.
	modelsSeen atomic.Pointer[map[string]int64]
	// trustRead is each remote site's trust per model at the last
	// refresh (grid_route_site_trust); written under refreshMu.
	trustRead map[siteModel]float64

	// opGen is the identity generation the kept operator connection was
	// made under; only the goroutine running Poll touches it.
	opGen uint64

	// The poll loop's WARN state, guarded by warnMu.
	warnMu       sync.Mutex
	failing      int // polls failed in a row
	warnedResult string
	warnedAt     time.Time
}

// New builds a gateway from a validated configuration.
func New(cfg *config.Gateway, opts Options) (*Gateway, error) {
	if opts.Identity == nil {
		return nil, errors.New("the gateway needs its site identity (tls)")
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opTLS, err := opts.Identity.ClientTLS(cfg.Site)
	if err != nil {
		return nil, err
	}
	// A certificate that does not verify as this site's (another site, a
	// foreign CA) is an identity failure, not an unreachable operator:
	// crypto/tls passes the verifier's error up unmarked, so mark it.
	if verify := opTLS.VerifyPeerCertificate; verify != nil {
		opTLS.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
			if err := verify(raw, chains); err != nil {
				return &identityError{err}
			}
			return nil
		}
	}
	m := newMetrics()
	m.reg.MustRegister(opts.Identity.ExpiryGauge())
	service := &route.Service{}
	policy, err := route.NewPolicy(cfg.Availability.Policy, service)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		clk: opts.Clock, log: opts.Logger, id: opts.Identity, m: m,
		timeline: loadstore.NewTimeline(opts.Clock),
		store:    loadstore.New(storeWindow),
		service:  service,
		builder:  route.NewBuilder(policy),
		opClient: newOperatorClient(opTLS),
		wake:     make(chan struct{}, 1),
		first:    make(chan struct{}),
		ejected:  make(chan struct{}, 1),
		rep:      newReporter(),
		costs:    costObservers{prompt: m.requestTokens.WithLabelValues("prompt"), maxOutput: m.requestTokens.WithLabelValues("max_output")},
		picks:    picks{n: map[string]uint64{}},
		hist:     newHistory(),
		streams:  newStreamSet(),
	}
	g.stopping, g.interrupt = context.WithCancelCause(context.Background())
	g.health = newHealth(opts.Clock, func(reason string) {
		m.ejections.WithLabelValues(reason).Inc()
		select {
		case g.ejected <- struct{}{}:
		default: // a rebuild is already due
		}
	})
	g.cfg.Store(cfg)
	g.sessions = affinity.New(sessionBounds(&cfg.Affinity))
	m.registerAffinity(g.sessions)
	g.upstreams = newUpstreams(opts.Identity, cfg.Upstream, g.log)
	g.bodies = newBodyBudget(cfg.Limits.BodyBytes)
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "grid_gateway_body_bytes_held",
		Help: "Bytes of request bodies the gateway holds in memory now (reserved from limits.bodyBytes)."},
		func() float64 { return float64(g.bodies.used.Load()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "grid_gateway_detached_streams",
		Help: "SSE answers being copied now on the gateway's own goroutines, their connections taken from the HTTP server (docs/gateway.md)."},
		func() float64 { return float64(g.streams.Len()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "grid_gateway_body_bytes_limit",
		Help: "The request-body budget, limits.bodyBytes or its derived default."},
		func() float64 { return float64(g.bodies.limit.Load()) }))
	var seed [8]byte
	rand.Read(seed[:])
	g.turn.Store(binary.LittleEndian.Uint64(seed[:])) // replicas do not move in step
	g.local.Store(&route.Snapshot{})
	done := make(chan struct{})
	g.pollDone.Store(&done)
	// A gateway polls from its start, as if a request had just come: it
	// must read its operator to become ready (readyz), and it cannot be
	// sent requests before it is ready.
	g.lastRequest.Store(opts.Clock.Now().UnixNano())
	return g, nil
}

// settings turns the configuration and the operator's serving document
// into route settings.
func settings(cfg *config.Gateway, serving *signals.Serving) route.Settings {
	a := cfg.Availability
	s := route.Settings{
		Shedding: a.Shedding, Smoothing: *a.Smoothing, CeilingHalfLifeMs: float64(*a.CeilingHalfLifeMs),
		CeilingFloor: *a.CeilingFloor, ExploreFloor: *a.ExploreFloor, FullAfterMs: *a.FullAfterMs,
		RoomAfterMs: *a.RoomAfterMs, QueueFull: *a.QueueFull, SingleCeiling: a.CeilingModel == config.CeilingSingle,
	}
	// The load window must hold the latest reading of every site; the
	// operator knows its intervals and says how long that is. Before its
	// first document, assume the default intervals.
	s.WindowMs = (2*config.DefaultPeerPollInterval + config.DefaultScrapeInterval + config.DefaultPeerTimeout).Milliseconds()
	if serving != nil && serving.LoadWindowMs > 0 {
		s.WindowMs = serving.LoadWindowMs
	}
	return s
}

// Reload applies a new configuration's tuning; listeners and identity need
// a restart.
func (g *Gateway) Reload(next *config.Gateway) error {
	cur := g.cfg.Load()
	if next.Site != cur.Site || next.Listen != cur.Listen || next.Hop != cur.Hop || next.Metrics != cur.Metrics ||
		next.Operator != cur.Operator || next.TrustDomain != cur.TrustDomain || !next.TLS.SameFiles(*cur.TLS) || next.Upstream != cur.Upstream {
		return errors.New("site, trustDomain, tls, operator, upstream and listeners cannot change on reload; restart the gateway")
	}
	if next.Limits.HeaderReadTimeout != cur.Limits.HeaderReadTimeout || next.Limits.ClientIdleTimeout != cur.Limits.ClientIdleTimeout {
		return errors.New("limits.headerReadTimeout and limits.clientIdleTimeout are the listeners' and need a restart; the other limits apply on reload")
	}
	if next.Availability.Policy != g.builder.Policy().Name() {
		policy, err := route.NewPolicy(next.Availability.Policy, g.service)
		if err != nil {
			return err
		}
		g.builder.SetPolicy(policy) // the next rebuild reads by it
	}
	g.cfg.Store(next)
	// Connection caps and the body budget apply to what comes next.
	for _, l := range Listeners {
		if gl := g.guards[l].Load(); gl != nil {
			gl.SetLimits(connLimits(l, next.Limits))
		}
	}
	g.bodies.setLimit(next.Limits.BodyBytes)
	g.m.affinity.WithLabelValues(affinityEvicted).Add(float64(g.sessions.SetBounds(sessionBounds(&next.Affinity))))
	g.refresh()
	return nil
}

// CountReload records a reload's result.
func (g *Gateway) CountReload(applied bool) {
	g.m.reloads.WithLabelValues(map[bool]string{true: "applied", false: "rejected"}[applied]).Inc()
}

// touch records a request; an idle gateway starts polling again.
func (g *Gateway) touch() {
	g.lastRequest.Store(g.clk.Now().UnixNano())
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Run polls the operator every pollInterval while the gateway serves:
// from the first request until it has been idle for idleAfter.
//
// Against an operator that answers long polls (its answers carry a
// cursor), each poll waits at the operator for the board to change, so a
// change reaches the snapshot as soon as it is published; polls are at
// least minPollGap apart, so a board that changes many times a second is
// read in batches. Against one that does not, the gateway polls every
// pollInterval. Either way a second goroutine, owned here, rebuilds the
// snapshot every pollInterval (readings age) and at once after a passive
// health ejection (docs/protocol.md §4.11), a third measures the round
// trip to each peer site's gateway (probe.go), and a fourth watches the
// hop's connections for a silent peer (hoplive.go).
func (g *Gateway) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); g.refreshLoop(ctx) }()
	go func() { defer wg.Done(); g.probeLoop(ctx) }()
	go func() { defer wg.Done(); g.upstreams.hop.run(ctx) }()
	defer wg.Wait()
	for {
		cfg := g.cfg.Load()
		if g.lastRequest.Load() == 0 || g.idle() {
			g.cursor.Store(nil) // the wake poll is a plain read
			select {
			case <-ctx.Done():
				return
			case <-g.wake:
			}
		}
		start := g.clk.Now()
		ok := g.Poll(ctx)
		gap := cfg.PollInterval.D()
		if ok && g.cursor.Load() != nil {
			gap = minPollGap
		}
		if !clock.Sleep(ctx, g.clk, max(0, gap-g.clk.Now().Sub(start))) {
			return
		}
	}
}

// idle reports whether no request came for availability's idleAfter.
func (g *Gateway) idle() bool {
	return g.clk.Now().Sub(time.Unix(0, g.lastRequest.Load())) > g.cfg.Load().IdleAfter.D()
}

// newOperatorClient is the client of the gateway's polls of its operator.
// It keeps one connection, verified at its handshake, and reuses it poll
// after poll, as a peer poll does (docs/protocol.md §4.1): the operator's
// listener closes it after 300 s, a change of this site's certificate
// material or a failed poll drops it (dropConnOnNewTrust, Poll), so no
// connection outlives the trust that admitted it by more than that. A
// handshake per poll, paid at every change of the board since long polls
// return at each, was a quarter of a near-idle gateway's CPU in a profile.
func newOperatorClient(conf *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		TLSClientConfig:     conf,
		MaxIdleConnsPerHost: 1,
		// Below the operator's keep-alive limit (its HeaderRead, 10 s), so
		// a gateway that went idle redials rather than finding its
		// connection closed under a request.
		IdleConnTimeout:     5 * time.Second,
		TLSHandshakeTimeout: pollTimeout,
		ForceAttemptHTTP2:   false,
	}}
}

// dropConnOnNewTrust closes the kept operator connection when this site's
// certificate material changed since it was made: it was verified under
// trust that may be gone. Only the goroutine running Poll calls it.
func (g *Gateway) dropConnOnNewTrust() {
	if gen := g.id.Generation(); gen != g.opGen {
		g.opClient.CloseIdleConnections()
		g.opGen = gen
	}
}

// minPollGap spaces long polls.
const minPollGap = 200 * time.Millisecond

// longPollWait is how long a poll waits at the operator for a change.
const longPollWait = 25 * time.Second

// refreshLoop rebuilds the snapshot every pollInterval, and at once when
// passive health ejects an upstream, until ctx ends.
func (g *Gateway) refreshLoop(ctx context.Context) {
	t := g.clk.NewTicker(g.cfg.Load().PollInterval.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			g.refresh()
		case <-g.ejected:
			g.refresh()
		}
	}
}

// Poll runs one cycle: read the operator's relay (page by page, when the
// operator's body cap cuts it) and serving document, ingest, rebuild the
// snapshot. The snapshot is rebuilt after every cycle, success or not, so
// readings age and learned state decays.
func (g *Gateway) Poll(ctx context.Context) (ok bool) {
	cfg := g.cfg.Load()
	g.dropConnOnNewTrust()
	base := strings.TrimRight(cfg.Operator.Signals, "/")
	firstURL, timeout := base+signals.SignalsPath, pollTimeout
	if c := g.cursor.Load(); c != nil {
		// The operator answers when the board moves past the cursor.
		firstURL += "?" + signals.WaitParam + "=" + longPollWait.String() + "&" + signals.SinceParam + "=" + url.QueryEscape(*c)
		timeout += longPollWait
		g.waitingSince.Store(g.clk.Now().UnixNano())
	}
	first, err := g.fetchWithin(ctx, firstURL, timeout)
	g.waitingSince.Store(0)
	if err == nil {
		var doc fetched
		if doc, err = g.fetch(ctx, base+signals.ServingPath); err == nil {
			var s signals.Serving
			if err = json.Unmarshal(doc.body, &s); err != nil {
				err = &pollError{"encoding", err}
			} else if s.Site != cfg.Site {
				err = &pollError{"unauthorized", fmt.Errorf("serving document of site %q", s.Site)}
			} else {
				g.serving.Store(&s)
			}
		}
	}
	skew, size := 0, 0
	if err == nil {
		skew, size = g.ingest(first, cfg.Site), len(first.body)
	}
	// The rest of the relay. A page that fails fails the whole poll: the
	// rows read are kept, but nothing is forgotten and no clean observation
	// is reported on a partial read.
	for pages, next := 1, first.next; err == nil && next != ""; pages++ {
		if pages == maxRelayPages {
			err = &pollError{"too_large", fmt.Errorf("relay longer than %d pages", maxRelayPages)}
			break
		}
		var page fetched
		if page, err = g.fetch(ctx, base+signals.SignalsPath+"?"+signals.AfterParam+"="+url.QueryEscape(next)); err == nil {
			skew += g.ingest(page, cfg.Site)
			size += len(page.body)
			next = page.next
		}
	}
	if err != nil && ctx.Err() != nil {
		return false
	}
	if err != nil {
		g.cursor.Store(nil) // the next read is a plain one
		// As a peer poll's: the next poll dials and verifies afresh, so
		// an operator replaced behind the address (restarted, with a new
		// certificate) is verified as it now is.
		g.opClient.CloseIdleConnections()
		g.pollFailed(err)
		// Skew seen in the pages read is evidence; silence is not.
		if skew > 0 {
			g.rep.fold(skew)
		}
		g.refresh()
		g.polled(false)
		if g.rep.pendingBad() {
			g.report(ctx, base)
		}
		return false
	}
	if first.cursor != "" {
		g.cursor.Store(&first.cursor)
	} else {
		g.cursor.Store(nil) // an operator without long polls
	}
	g.m.polls.WithLabelValues("ok").Inc()
	g.m.lastSuccess.Set(float64(g.clk.Now().UnixMilli()) / 1000)
	g.m.responseBytes.Set(float64(size))
	g.forget(cfg)
	// Fold the observation before the refresh, so nothing that happens to
	// the refresh can lose a skew drop.
	g.rep.fold(skew)
	g.refresh()
	g.polled(true)
	g.report(ctx, base)
	return true
}

// pollFailed counts a failed poll and says why at WARN: at once when reads
// start failing or fail differently, then at most every warnEvery.
func (g *Gateway) pollFailed(err error) {
	result := pollResult(err)
	g.m.polls.WithLabelValues(result).Inc()
	now := g.clk.Now()
	g.warnMu.Lock()
	defer g.warnMu.Unlock()
	g.failing++
	if result != g.warnedResult || now.Sub(g.warnedAt) >= warnEvery {
		g.log.Warn("cannot read the operator; routing on what was read before, which ages", "result", result,
			"operator", g.cfg.Load().Operator.Signals, "failed_polls", g.failing, "err", err)
		g.warnedResult, g.warnedAt = result, now
	}
}

// polled marks the end of a poll cycle: a success records when and says so
// if reads had been failing; either way, requests waiting for a fresh
// snapshot (awaitFresh) are woken.
func (g *Gateway) polled(ok bool) {
	if ok {
		g.lastRead.Store(g.clk.Now().UnixNano())
		g.firstOnce.Do(func() { close(g.first) })
		g.warnMu.Lock()
		if g.failing > 0 {
			g.log.Info("operator read again", "operator", g.cfg.Load().Operator.Signals, "failed_polls", g.failing)
		}
		g.failing, g.warnedResult = 0, ""
		g.warnMu.Unlock()
	}
	done := make(chan struct{})
	close(*g.pollDone.Swap(&done))
}

// ingest stores one relay page, counts its refusals and returns its skew
// refusals (ages and epochs out of bounds), the evidence the rejection
// report carries.
func (g *Gateway) ingest(page fetched, site string) int {
	res := g.store.Ingest(page.body, page.date.UnixMilli(), g.timeline.NowMs(), g.clk.Now().UnixMilli(), signals.Origin{Site: site, Relay: true})
	for _, r := range signals.Refusals() {
		if n := res.Refused[r]; n > 0 {
			g.m.dropped.WithLabelValues(r.IngestLabel()).Add(float64(n))
		}
	}
	return res.Refused[signals.RefuseAge] + res.Refused[signals.RefuseEpoch]
}

func pollResult(err error) string {
	var pe *pollError
	if errors.As(err, &pe) {
		return pe.result
	}
	return "unreachable"
}

// report delivers pending skew evidence to the operator; a failure is
// counted and the evidence kept, and never fails the poll.
func (g *Gateway) report(ctx context.Context, base string) {
	if reason := g.rep.deliver(ctx, g.opClient, base+signals.FeedbackPath); reason != "" {
		g.m.feedbackFailures.WithLabelValues(reason).Inc()
	}
}

// identityError marks a failed verification of the operator's certificate.
type identityError struct{ err error }

func (e *identityError) Error() string { return "operator identity: " + e.err.Error() }
func (e *identityError) Unwrap() error { return e.err }

type pollError struct {
	result string
	err    error
}

func (e *pollError) Error() string { return e.result + ": " + e.err.Error() }
func (e *pollError) Unwrap() error { return e.err }

// fetched is one operator document with its answer's Date and, for a
// relay page the operator's body cap cut, where the next page starts.
type fetched struct {
	body []byte
	date time.Time
	next string
	// cursor is the answer's long-poll cursor; "" from an operator that
	// does not answer long polls.
	cursor string
}

// fetch GETs one operator document, bounded in time and size.
func (g *Gateway) fetch(ctx context.Context, url string) (fetched, error) {
	return g.fetchWithin(ctx, url, pollTimeout)
}

// fetchWithin is fetch bounded by timeout (a long poll's is its wait and
// the poll timeout).
func (g *Gateway) fetchWithin(ctx context.Context, url string, timeout time.Duration) (fetched, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fetched{}, &pollError{"config", err}
	}
	resp, err := g.opClient.Do(req)
	if err != nil {
		var ie *identityError
		var cve *tls.CertificateVerificationError
		if errors.As(err, &ie) || errors.As(err, &cve) {
			return fetched{}, &pollError{"unauthorized", err}
		}
		return fetched{}, &pollError{"unreachable", err}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusForbidden {
		return fetched{}, &pollError{"unauthorized", fmt.Errorf("HTTP %d", resp.StatusCode)}
	}
	if resp.StatusCode != http.StatusOK {
		return fetched{}, &pollError{"unreachable", fmt.Errorf("HTTP %d", resp.StatusCode)}
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, signals.MaxAnswerBytes+1)); err != nil {
		return fetched{}, &pollError{"unreachable", err}
	}
	if buf.Len() > signals.MaxAnswerBytes {
		return fetched{}, &pollError{"too_large", errors.New("answer exceeds 1 MiB")}
	}
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return fetched{}, &pollError{"no_date", err}
	}
	return fetched{body: buf.Bytes(), date: date, next: resp.Header.Get(signals.RelayNextHeader), cursor: resp.Header.Get(signals.CursorHeader)}, nil
}

// topology is the candidate list: this site's providers from its operator's
// serving document, and every remote provider the relay says serves a model,
// reached through that site's gateway as the local configuration names it.
// A remote site without a configured gateway has no route.
func (g *Gateway) topology() []route.Candidate {
	s := g.serving.Load()
	if s == nil {
		return nil
	}
	var out []route.Candidate
	for _, p := range s.Providers {
		u, err := url.Parse(p.Upstream)
		if err != nil {
			u = nil
		}
		out = append(out, route.Candidate{Model: p.Model, Site: s.Site, Provider: p.Name, Local: true, Upstream: u, Admission: route.AdmissionOf(p.Admission)})
	}
	gateways := map[string]*url.URL{}
	for _, p := range s.Peers {
		if u, err := url.Parse(p.Gateway); err == nil && p.Gateway != "" {
			gateways[p.Site] = u
		}
	}
	var remote []route.Candidate
	for _, k := range g.store.Keys() {
		if k.Site == s.Site {
			continue
		}
		v, ok := g.store.View(k)
		if !ok || v.Model == "" {
			continue
		}
		remote = append(remote, route.Candidate{Model: v.Model, Site: k.Site, Provider: k.Provider, Upstream: gateways[k.Site], Admission: route.AdmissionOf(v.Admission)})
	}
	sort.SliceStable(remote, func(i, j int) bool { return remote[i].Site < remote[j].Site })
	return append(out, remote...)
}

// forget drops providers whose rows stopped arriving (forgetAfter, and
// never less than two load windows, so a live peer is not forgotten
// between its polls). It runs only after a successful poll: a gateway that
// cannot read its operator, or has been idle, keeps what it knew.
func (g *Gateway) forget(cfg *config.Gateway) {
	horizon := cfg.ForgetAfter.D().Milliseconds()
	if s := g.serving.Load(); s != nil {
		horizon = max(horizon, 2*s.LoadWindowMs)
	}
	if gone := g.store.Forget(g.timeline.NowMs() - horizon); len(gone) > 0 {
		g.builder.Forget(gone)
		g.log.Info("forgot providers no longer relayed", "providers", gone, "after", time.Duration(horizon)*time.Millisecond)
	}
}

// refresh rebuilds the snapshot and the hop view, and publishes gauges.
func (g *Gateway) refresh() {
	g.refreshMu.Lock()
	defer g.refreshMu.Unlock()
	cfg := g.cfg.Load()
	set := settings(cfg, g.serving.Load())
	base := g.topology()
	live := map[string]bool{}
	for _, c := range base {
		live[c.Site] = true
	}
	g.service.Retain(func(site string) bool { return live[site] })
	now := g.timeline.NowMs()
	snap := g.builder.Build(g.store, base, now, g.health.isDown, set)
	observed := map[string]bool{}
	for i := range snap.Candidates {
		c := &snap.Candidates[i]
		if at, ok := c.ReadingAt(); ok && !observed[c.Site] {
			observed[c.Site] = true
			g.m.readingAge.WithLabelValues(c.Site).Observe(float64(max(now-at, 0)) / 1000)
		}
	}
	g.local.Store(localView(snap))
	g.noteModels(snap)
	g.m.publish(snap)
	g.noteTrust(snap, func(site, model string) float64 { return g.service.Served(site, model).Trust(now) })
	g.hist.record(g.View(), g.clk.Now())
}

// siteModel names one site's service of one model.
type siteModel struct{ site, model string }

// distrustedBelow is the trust at or below which a remote site is logged
// as distrusted: its board is read at half its claims or less, so a third
// of its recent answers or more contradicted it, which an honest board on a
// healthy path does not do.
const distrustedBelow = 0.5

// noteTrust publishes each remote site's trust per model
// (grid_route_site_trust), and warns when a site falls to distrustedBelow:
// an operator must find out whether the peer's board lies or the path to
// it delays answers (docs/operations.md). refreshMu is held.
func (g *Gateway) noteTrust(snap *route.Snapshot, trustOf func(site, model string) float64) {
	read := map[siteModel]float64{}
	for i := range snap.Candidates {
		c := &snap.Candidates[i]
		k := siteModel{c.Site, c.Model}
		if _, ok := read[k]; ok || c.Local {
			continue
		}
		trust := trustOf(c.Site, c.Model)
		read[k] = trust
		g.m.trust.WithLabelValues(c.Site, c.Model).Set(trust)
		was, known := g.trustRead[k]
		switch wasDistrusted := known && was <= distrustedBelow; {
		case trust <= distrustedBelow && !wasDistrusted:
			g.log.Warn("a remote site's answers contradict its board: it is read at a share of the capacity it claims",
				"site", c.Site, "model", c.Model, "trust", trust)
		case trust > distrustedBelow && wasDistrusted:
			g.log.Info("a remote site's answers agree with its board again", "site", c.Site, "model", c.Model, "trust", trust)
		}
	}
	for k := range g.trustRead {
		if _, ok := read[k]; !ok {
			g.m.trust.DeleteLabelValues(k.site, k.model)
		}
	}
	g.trustRead = read
}

// noteModels records when each of snap's models was first seen; refreshMu
// is held. A model that leaves and returns keeps its first sighting.
func (g *Gateway) noteModels(snap *route.Snapshot) {
	var seen map[string]int64
	if p := g.modelsSeen.Load(); p != nil {
		seen = *p
	}
	var next map[string]int64 // a copy, made once a model is new
	for _, m := range snap.Models() {
		if _, ok := seen[m]; ok {
			continue
		}
		if next == nil {
			next = maps.Clone(seen)
			if next == nil {
				next = map[string]int64{}
			}
		}
		next[m] = g.clk.Now().Unix()
	}
	if next != nil {
		g.modelsSeen.Store(&next)
	}
}

// modelCreated is when model was first seen (unix seconds), 0 if never.
func (g *Gateway) modelCreated(model string) int64 {
	if seen := g.modelsSeen.Load(); seen != nil {
		return (*seen)[model]
	}
	return 0
}

// localView is the snapshot restricted to this site's providers, for
// requests a peer forwarded: they are never forwarded again. It routes with
// the configured policy and sheds as the full snapshot does.
func localView(s *route.Snapshot) *route.Snapshot {
	return s.Restrict(func(c *route.Candidate) bool { return c.Local })
}

// awaitFresh waits, where it must, until the snapshots a request routes on
// (Gateway.view) are fresh: built within the load window from a successful
// read of the operator. Before the first read it waits, bounded, for it,
// and refuses with operator_unreachable if it does not come. After an idle
// period (no polls, so the snapshot kept the readings of its last build) it
// waits for the wake poll, up to the poll timeout; if that poll fails, the
// snapshot is rebuilt now, so readings older than the load window count as
// unknown (never idle) rather than as the present. The common case is one
// atomic load and a comparison.
func (g *Gateway) awaitFresh(ctx context.Context) *apiError {
	select {
	case <-g.first:
	default:
		wait := max(3*g.cfg.Load().PollInterval.D(), 3*time.Second)
		t := g.clk.NewTimer(wait)
		defer t.Stop()
		select {
		case <-g.first:
		case <-t.C():
			return &errOperatorUnreachable
		case <-ctx.Done():
			return &errOperatorUnreachable
		}
	}
	window := time.Duration(settings(g.cfg.Load(), g.serving.Load()).WindowMs) * time.Millisecond
	if g.boardAge() <= window {
		return nil
	}
	done := *g.pollDone.Load()
	t := g.clk.NewTimer(pollTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C():
	case <-ctx.Done():
	}
	if g.boardAge() > window {
		g.refresh() // at now: what is older than the load window is unknown
	}
	return nil
}

// boardAge is how old what the gateway holds may be: the time since its
// latest successful read, or nothing while a long poll waits at the
// operator (which answers as soon as anything changes).
func (g *Gateway) boardAge() time.Duration {
	now := g.clk.Now()
	if since := g.waitingSince.Load(); since != 0 && now.Sub(time.Unix(0, since)) < longPollWait+pollTimeout {
		return 0
	}
	last := g.lastRead.Load()
	if last == 0 {
		return time.Duration(math.MaxInt64)
	}
	return now.Sub(time.Unix(0, last))
}

// Ready reports whether the gateway can route: it has read its operator,
// and, while it polls, its latest successful read is within the load
// window. An idle gateway stays ready: its next request wakes it and waits
// for a fresh read (awaitFresh).
func (g *Gateway) Ready() (bool, string) {
	last := g.lastRead.Load()
	if last == 0 {
		return false, "the operator has not been read yet (grid_signals_poll_total says why)"
	}
	cfg := g.cfg.Load()
	now := g.clk.Now()
	if now.Sub(time.Unix(0, g.lastRequest.Load())) > cfg.IdleAfter.D() {
		return true, "idle"
	}
	window := time.Duration(settings(cfg, g.serving.Load()).WindowMs) * time.Millisecond
	if age := g.boardAge(); age > window {
		return false, fmt.Sprintf("no successful read of the operator for %v (load window %v)", age.Round(time.Second), window)
	}
	return true, "ok"
}

// Snapshot is the current routing snapshot, for views such as the demo's.
func (g *Gateway) Snapshot() *route.Snapshot { return g.builder.Current() }

// DrainStreams waits until every detached stream has ended, or ctx is
// done; then it ends those left, and the streams the servers copy, with
// the terminal event (InterruptStreams). Call it after the client
// listener's server has shut down: the server does not wait for them.
func (g *Gateway) DrainStreams(ctx context.Context) error {
	err := g.streams.drain(ctx)
	g.InterruptStreams(ctx)
	return err
}

// InterruptStreams, once ctx is done (a drain's deadline passed), ends
// every stream a server copies itself with the terminal event, so that a
// last Shutdown lets their handlers write it and end the answers well
// framed before the connections close. With ctx not done it does
// nothing: the drain is still within its time.
func (g *Gateway) InterruptStreams(ctx context.Context) error {
	if ctx.Err() != nil {
		g.interrupt(errShutdown)
	}
	return nil
}

// errShutdown is the cause of an upstream request a drain past its
// deadline cancelled: its stream ends with the terminal event.
var errShutdown = errors.New("the gateway's drain timed out")

// Close cuts the detached streams still running and releases idle
// upstream connections.
func (g *Gateway) Close() {
	g.streams.cutAndWait(false)
	g.upstreams.close()
	g.opClient.CloseIdleConnections()
}
