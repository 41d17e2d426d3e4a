// Package operator is the site operator: it scrapes this site's inference
// providers, decides their readiness, estimates their in-flight load and
// latency, and publishes the conclusions in batches to its site store and as
// Prometheus series. (The cross-site half — the mTLS signals endpoint, peer
// polling and the relay — builds on the same store.)
package operator

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grid-inference/grid/internal/backend"
	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/latency"
	"github.com/grid-inference/grid/internal/readiness"
	"github.com/grid-inference/grid/internal/signals"
)

// Options are the operator's collaborators.
type Options struct {
	Clock  clock.Clock
	Logger *slog.Logger
	// Identity is the site's certificate material. Without it the operator
	// scrapes and serves /metrics only: no signals, no peers.
	Identity *identity.Source
	// Dial, when set, opens the peer polls' connections (tests resolve
	// advertised names with it); nil dials with the system resolver.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Operator is one site's operator.
type Operator struct {
	clk   clock.Clock
	log   *slog.Logger
	state *State
	memo  *backend.ProbeMemo
	site  *Store
	m     *metrics
	id    *identity.Source
	// peerStore holds what peers published, keyed "peer/provider".
	peerStore *Store
	poller    *peerPoller
	reports   *gatewayReports
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	// discovered are the peers gossip found (SetDiscovered).
	discovered atomic.Pointer[[]config.Peer]
	// pollSetMu serialises reading the poll set and handing it to the
	// poller, so a reload and a gossip update racing each other cannot
	// leave the poller with the older of the two.
	pollSetMu sync.Mutex
	// waits is the long poll's state (longpoll.go).
	waits *waits
	// stateTrouble is why stateDir cannot be written, or "" (the scrape
	// loop sets it; readiness reads it).
	stateTrouble atomic.Pointer[string]
	// stateWarned is when stateDir trouble was last logged (the state
	// loop's).
	stateWarned time.Time
	// stateChecks counts the state loop's rounds (checkState).
	stateChecks atomic.Int64

	cfg       atomic.Pointer[config.Operator]
	sequence  atomic.Int64 // batch sequence within this epoch
	providers sync.Map     // name -> *provider
	// loops are the providers' scrape loops, while Run runs.
	loops    *scrapeLoops
	reloadMu sync.Mutex
}

// provider is one provider's scrape history.
type provider struct {
	cfg    config.Provider
	target *backend.Target

	mu      sync.Mutex // one scrape of a provider at a time
	probe   readiness.Probe
	history latency.History
	verdict readiness.Verdict
	engine  *backend.EngineLoad
	// phase is when the provider recomputes its gauges, learnt while
	// metrics.refreshInterval is set; nil otherwise.
	phase   *refreshPhase
	scraped bool
	// failing is true while the latest scrape failed.
	failing bool
	// removed: a reload dropped the provider; a scrape that was waiting
	// for mu, or is started by a pass that listed it before, does nothing.
	removed bool
	// cycle is the time from the provider's latest scrape tick to that
	// scrape's end (its wait for a place among the scrapes in flight
	// included), ns: the readiness floor of its next scrape. Written by its
	// scrape loop (or Pass), read by its next scrape's conclusion.
	cycle atomic.Int64
	// concluded is set by the first scrape's end; readiness reads it
	// without waiting for a scrape that holds mu.
	concluded atomic.Bool
}

// currentConfig is p's configuration now (a reload may change it).
func (p *provider) currentConfig() *config.Provider {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.cfg
	return &c
}

// New builds an operator from a validated configuration and its opened
// state (OpenState). It fails when the gateway reports kept in stateDir
// cannot be read.
func New(cfg *config.Operator, state *State, opts Options) (*Operator, error) {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	o := &Operator{
		clk:       opts.Clock,
		log:       opts.Logger,
		state:     state,
		site:      NewStore(cfg.SignalsTTL.D()),
		peerStore: NewStore(cfg.PeerPoll.TTL.D()),
		id:        opts.Identity,
		dial:      opts.Dial,
	}
	o.waits = newWaits()
	o.loops = newScrapeLoops(o)
	o.site.changed, o.peerStore.changed = o.waits.siteChanged, o.waits.peersChanged
	o.memo = backend.NewProbeMemo(opts.Clock, func(url string) { o.countReprobe(url, reprobeExpired) })
	o.m = newMetrics(o)
	o.cfg.Store(cfg)
	for i := range cfg.Providers {
		o.addProvider(&cfg.Providers[i])
	}
	if o.id != nil {
		o.poller = newPeerPoller(o)
		o.poller.configure(cfg.Peers)
		o.m.reg.MustRegister(o.id.ExpiryGauge())
	}
	var err error
	if o.reports, err = loadGatewayReports(cfg.StateDir, o.m.reg); err != nil {
		return nil, err
	}
	return o, nil
}

// PeerStore is what the operator holds of its peers' rows.
func (o *Operator) PeerStore() *Store { return o.peerStore }

func (o *Operator) addProvider(p *config.Provider) {
	o.providers.Store(p.Name, &provider{cfg: *p, target: backend.NewTarget(p)})
	o.m.scrapes.initProvider(p.Name)
}

// SiteStore is this site's published rows.
func (o *Operator) SiteStore() *Store { return o.site }

// Epoch is the publisher epoch of this process.
func (o *Operator) Epoch() int64 { return o.state.Epoch }

// Run scrapes every provider in a loop of its own (scrapeLoop: its own
// interval, timeout and phase, at most scrapeConcurrency scrapes at once)
// and keeps stateDir whole once per scrapeInterval, until ctx ends; it
// returns once every loop has.
func (o *Operator) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		every(ctx, o.clk, func() time.Duration { return o.cfg.Load().ScrapeInterval.D() }, o.checkState)
	}()
	o.loops.run(ctx)
	wg.Wait()
}

// Pass scrapes every provider once now, at most scrapeConcurrency at a
// time, each publishing as soon as its scrape ends; each scrape's cycle is
// the time from the pass's start to its end. Tests drive the operator by
// passes on a fake clock; Run does not use it.
func (o *Operator) Pass(ctx context.Context) {
	var all []*provider
	o.providers.Range(func(_, v any) bool {
		all = append(all, v.(*provider))
		return true
	})
	start := o.clk.Now()
	forEachBounded(ctx, o.cfg.Load().ScrapeConcurrency, all, func(p *provider) {
		o.scrape(ctx, p, false)
		p.cycle.Store(int64(o.clk.Now().Sub(start)))
	})
}

// scrape reads one provider and publishes what it concludes; a probe
// (probe set) only tells the provider's refresh phase what it served. It
// reports whether a reload removed the provider, so its loop ends.
func (o *Operator) scrape(ctx context.Context, p *provider, probe bool) (removed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.removed {
		return true
	}
	// Only a provider judged Ready has a missing /v1/loads remembered: an
	// engine not yet scraped, or not ready, may be warming up, and its 404
	// a warm-up artefact rather than a definitive "no such route"
	// (docs/protocol.md §4.2).
	ready := p.scraped && p.verdict.Reason == readiness.Ready
	start := o.clk.Now()
	reading, err := backend.Scrape(ctx, p.target, o.memo, ready, o.log)
	if ctx.Err() != nil {
		return false // shutting down: a cancelled scrape says nothing about the provider
	}
	// What the scrape served is stamped when it was computed: at the
	// scrape, unless the backend recomputes its gauges on a period (the
	// refresh phase says when); a failure is stamped at the scrape.
	now := o.clk.Now()
	servedAt := now
	if period := p.cfg.Metrics.RefreshInterval.D(); period > 0 {
		if p.phase == nil || p.phase.period != period {
			p.phase = newRefreshPhase(period)
		}
		var gauges poolGauges
		ok := false
		if err == nil {
			gauges, ok = gaugesOf(reading)
		}
		p.phase.observe(start, now, gauges, ok, probe)
		if err == nil {
			servedAt = p.phase.servedAt(start)
		}
		o.m.phaseWidth.WithLabelValues(p.cfg.Name).Set(p.phase.width.Seconds())
	} else if p.phase != nil {
		// A reload stopped declaring the refresh.
		p.phase = nil
		o.m.phaseWidth.DeleteLabelValues(p.cfg.Name)
	}
	if !probe {
		o.conclude(p, now, servedAt, reading, err)
	}
	return false
}

// plan is when p's scrape loop scrapes next after the scrape that started
// at tick, every interval: at tick plus interval, or, while p's refresh
// phase is learnt, just after a recomputation (refreshPhase.nextTick),
// with a probe before it (refreshPhase.probeBefore; zero when none). A
// probe already past is skipped.
func (p *provider) plan(tick, now time.Time, interval time.Duration) (next, probe time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase == nil {
		return tick.Add(interval), time.Time{}
	}
	next = p.phase.nextTick(tick, interval)
	if at, ok := p.phase.probeBefore(next); ok && at.After(now) && at.Before(next) {
		probe = at
	}
	return next, probe
}

// conclude folds one scrape into the provider's readiness, latency and load,
// then publishes what it served, stamped servedAt (docs/protocol.md §4.2,
// §4.6). Called with p.mu held.
func (o *Operator) conclude(p *provider, now, servedAt time.Time, r *backend.Reading, err error) {
	cfg := o.cfg.Load()
	name := p.cfg.Name
	p.scraped = true
	defer p.concluded.Store(true)
	var pub latency.Published
	if err == nil && p.failing && o.memo.Absent(p.target.LoadsURL) {
		// A failed scrape, then a good one: the engine behind the URL may
		// have been restarted or upgraded, and gained /v1/loads.
		o.memo.Forget(p.target.LoadsURL)
		o.countReprobe(p.target.LoadsURL, reprobeRecovered)
	}
	wasFailing := p.failing
	p.failing = err != nil
	if err != nil {
		class := backend.ClassOf(err)
		p.probe.Failure(now, string(class))
		o.m.scrapes.count(name, string(class))
		if !wasFailing {
			// The first failure is said at once; the readiness verdict
			// follows after the stale window.
			o.log.Warn("provider scrape failed", "provider", name, "class", class, "err", err)
		} else {
			o.log.Debug("scrape failed", "provider", name, "class", class, "err", err)
		}
	} else {
		if wasFailing {
			o.log.Info("provider scrape succeeded again", "provider", name)
		}
		if r.Latency != nil {
			var progress bool
			pub, progress = p.history.Observe(now, *r.Latency, r.MultiPool)
			if progress {
				p.probe.Progress(now)
			}
		}
		ready := p.probe.Thaw(now, r.Ready, r.UnitsReporting)
		p.probe.Success(now, ready, r.Missing)
		p.engine = r.Engine
		o.m.scrapes.count(name, r.Result)
		if r.Result == backend.ResultSuccess {
			o.m.lastSuccess.WithLabelValues(name).Set(float64(now.UnixMilli()) / 1000)
		}
	}
	staleAfter := readiness.StaleAfter(cfg.StaleAfter(&p.cfg), cfg.ScrapeIntervalOf(&p.cfg), time.Duration(p.cycle.Load()))
	verdict := p.probe.Verdict(now, staleAfter, p.cfg.Unavailable)
	if verdict.Reason != p.verdict.Reason {
		o.log.Info("provider readiness changed", "provider", name, "reason", verdict.Reason, "status", verdict.Status, "message", verdict.Message)
	}
	p.verdict = verdict

	var rows []signals.Row
	switch {
	case err == nil:
		rows = append(rows, r.Rows...)
		rows = append(rows, o.conclusions(p, verdict)...)
		if v, ok := r.Load.InFlight(p.probe.ReadyEndpoints()); ok {
			rows = append(rows, signals.Row{Name: signals.InFlight, Value: v})
		}
		if v := r.Load.PrefillTokens; v != nil {
			rows = append(rows, signals.Row{Name: signals.PrefillBacklog, Value: *v})
		}
		if v, ok := maxRunning(&p.cfg, &r.Load); ok {
			rows = append(rows, signals.Row{Name: signals.MaxRunning, Value: v})
		}
		for _, l := range []struct {
			name string
			v    *float64
		}{{signals.TTFTP50, pub.TTFTP50}, {signals.TTFTP90, pub.TTFTP90}, {signals.TPOT, pub.TPOT}, {signals.ErrorRatio, pub.ErrorRatio}} {
			if l.v != nil {
				rows = append(rows, signals.Row{Name: l.name, Value: *l.v})
			}
		}
	case verdict.Excludes():
		rows = o.conclusions(p, verdict)
	default:
		// Nothing new to say: the last batch serves until its TTL ends.
		return
	}
	// A backend that recomputes its gauges every refreshInterval served
	// values computed before this scrape: stamped at the scrape, they
	// would read younger than they are, and the gateways would not drain
	// them enough.
	o.publish(name, rows, servedAt)
}

// providerTarget returns a provider's scrape target, or nil.
func (o *Operator) providerTarget(name string) *backend.Target {
	if v, ok := o.providers.Load(name); ok {
		return v.(*provider).target
	}
	return nil
}

// countReprobe counts a forgotten /v1/loads absence for each provider of
// url.
func (o *Operator) countReprobe(url, reason string) {
	o.providers.Range(func(k, v any) bool {
		if v.(*provider).target.LoadsURL == url {
			o.m.reprobes.WithLabelValues(k.(string), reason).Inc()
		}
		return true
	})
}

// conclusions are the ready verdict and the last good ready count.
func (o *Operator) conclusions(p *provider, v readiness.Verdict) []signals.Row {
	ready := 1.0
	if v.Excludes() {
		ready = 0
	}
	info := []signals.Label{{Name: signals.LabelModel, Value: p.cfg.Model}}
	if a, _ := signals.ParseAdmission(p.cfg.Admission); a != signals.AdmitNewAndExisting {
		// Sorted: "admission" renders before "model".
		info = append([]signals.Label{{Name: signals.LabelAdmission, Value: string(a)}}, info...)
	}
	rows := []signals.Row{
		{Name: signals.Info, Labels: info, Value: 1},
		{Name: signals.Ready, Value: ready},
	}
	if c := p.probe.ReadyEndpoints(); c.Known {
		rows = append(rows, signals.Row{Name: signals.ReadyEndpoints, Value: c.Value})
	}
	return rows
}

// publish attributes a batch to this site and provider, appends its batch
// metadata line, and stores it.
func (o *Operator) publish(target string, rows []signals.Row, now time.Time) {
	if o.state.Halted != "" {
		return // receivers would refuse every batch (State.Halted)
	}
	site := o.cfg.Load().Site
	for i := range rows {
		rows[i].Labels = attribute(rows[i].Labels, site, target)
	}
	rev := o.state.Revision(target)
	if rev == nil {
		return // removed by a reload while its scrape ran
	}
	meta := signals.Row{
		Name: signals.ConfigGeneration,
		Labels: []signals.Label{
			{Name: "batch_samples", Value: strconv.Itoa(len(rows))},
			{Name: "batch_sequence", Value: strconv.FormatInt(o.sequence.Add(1), 10)},
			{Name: signals.LabelProvider, Value: target},
			{Name: signals.LabelSite, Value: site},
			{Name: "provider_uid", Value: rev.UID},
			{Name: "publisher_epoch", Value: strconv.FormatInt(o.state.Epoch, 10)},
		},
		Value: float64(rev.Generation),
	}
	batch, _ := signals.ParseBatch(&meta)
	o.site.PutEntry(&Entry{Target: target, Rows: append(rows, meta), CollectedAt: now,
		ExpiresAt: now.Add(o.site.TTL()), Batch: &batch})
}

// attribute sets grid_site and grid_provider on a row's labels, moving any
// scraped value of the same name to exported_*, and sorts them.
func attribute(ls []signals.Label, site, provider string) []signals.Label {
	out := make([]signals.Label, 0, len(ls)+2)
	for _, l := range ls {
		if l.Name == signals.LabelSite || l.Name == signals.LabelProvider {
			l.Name = "exported_" + l.Name
		}
		out = append(out, l)
	}
	out = append(out, signals.Label{Name: signals.LabelSite, Value: site}, signals.Label{Name: signals.LabelProvider, Value: provider})
	signals.SortLabels(out)
	return out
}

// Verdicts returns every provider's latest verdict, for status and tests.
func (o *Operator) Verdicts() map[string]readiness.Verdict {
	out := map[string]readiness.Verdict{}
	o.providers.Range(func(k, v any) bool {
		p := v.(*provider)
		p.mu.Lock()
		out[k.(string)] = p.verdict
		p.mu.Unlock()
		return true
	})
	return out
}

// Reload applies a new, already validated configuration: new providers are
// added, removed ones forgotten (their series and rows too), changed ones
// rebuilt with a new generation; the whole /v1/loads memo is cleared. A
// reload that changes the site or listeners is refused: those need a restart.
func (o *Operator) Reload(next *config.Operator) error {
	o.reloadMu.Lock()
	defer o.reloadMu.Unlock()
	cur := o.cfg.Load()
	if next.Site != cur.Site || next.Signals != cur.Signals || next.Metrics != cur.Metrics || next.StateDir != cur.StateDir ||
		next.TrustDomain != cur.TrustDomain || (next.TLS == nil) != (cur.TLS == nil) || (next.TLS != nil && !next.TLS.SameFiles(*cur.TLS)) {
		return fmt.Errorf("site, trustDomain, tls, signals, metrics and stateDir cannot change on reload; restart the operator")
	}
	if err := o.state.Reconcile(next.Providers); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	wanted := map[string]*config.Provider{}
	for i := range next.Providers {
		wanted[next.Providers[i].Name] = &next.Providers[i]
	}
	o.providers.Range(func(k, v any) bool {
		name, p := k.(string), v.(*provider)
		np, keep := wanted[name]
		if keep && sameConfig(np, &p.cfg) {
			delete(wanted, name)
			return true
		}
		o.memo.Forget(p.target.LoadsURL)
		p.target.Close()
		if !keep {
			// A scrape in flight holds p.mu to its publication: wait for
			// it, so that neither its rows nor its series come back after
			// they are deleted here.
			p.mu.Lock()
			p.removed = true
			p.mu.Unlock()
			o.providers.Delete(name)
			o.site.Delete(name)
			o.m.forgetProvider(name)
			return true
		}
		// Changed: keep what readiness learned, scrape the new way.
		p.mu.Lock()
		p.cfg = *np
		p.target = backend.NewTarget(np)
		p.mu.Unlock()
		delete(wanted, name)
		return true
	})
	for _, np := range wanted {
		o.addProvider(np)
	}
	o.memo.Clear()
	o.cfg.Store(next)
	o.loops.sync()
	o.configurePollSet()
	o.waits.wakeAll() // what callers may read may have changed
	return nil
}

// configurePollSet hands the poller the current poll set.
func (o *Operator) configurePollSet() {
	if o.poller == nil {
		return
	}
	o.pollSetMu.Lock()
	defer o.pollSetMu.Unlock()
	o.poller.configure(o.peers())
}

// SetDiscovered replaces the peers found through gossip. They are polled,
// and served as peers, alongside the configured ones; a configured peer
// wins over gossip about the same site, and gossip about this site is
// ignored.
func (o *Operator) SetDiscovered(peers []config.Peer) {
	own := slices.Clone(peers)
	o.discovered.Store(&own)
	o.configurePollSet()
}

// peers is the poll set: the configured peers, then those discovered.
func (o *Operator) peers() []config.Peer {
	cfg := o.cfg.Load()
	out := slices.Clone(cfg.Peers)
	if d := o.discovered.Load(); d != nil {
		for _, p := range *d {
			if p.Site != cfg.Site && !slices.ContainsFunc(out, func(q config.Peer) bool { return q.Site == p.Site }) {
				out = append(out, p)
			}
		}
	}
	return out
}

func sameConfig(a, b *config.Provider) bool {
	ha, errA := configHash(a)
	hb, errB := configHash(b)
	return errA == nil && errB == nil && ha == hb
}

// Close releases the operator's idle connections to providers and peers.
func (o *Operator) Close() {
	defer o.state.Close()
	o.providers.Range(func(_, v any) bool {
		v.(*provider).target.Close()
		return true
	})
	if o.poller != nil {
		for _, ps := range o.poller.snapshot() {
			if ps.client != nil {
				ps.client.CloseIdleConnections()
			}
		}
	}
}

// Ready reports whether the operator publishes: its stateDir has been
// checked and is writable, its publisher epoch is admissible, and every
// provider has been scraped once. If not, it says why.
func (o *Operator) Ready() (bool, string) {
	switch {
	case o.state.Halted != "":
		return false, o.state.Halted
	case o.stateTrouble.Load() != nil && *o.stateTrouble.Load() != "":
		return false, *o.stateTrouble.Load()
	case o.stateChecks.Load() == 0:
		return false, "the operator has not started yet"
	}
	var waiting string
	o.providers.Range(func(k, v any) bool {
		if !v.(*provider).concluded.Load() {
			waiting = k.(string)
		}
		return waiting == ""
	})
	if waiting != "" {
		return false, fmt.Sprintf("provider %q has not been scraped yet", waiting)
	}
	return true, "ok"
}

// stateWarnEvery spaces the repeated ERRORs of a stateDir in trouble.
const stateWarnEvery = time.Minute

// checkState keeps stateDir whole once per scrapeInterval: a deleted
// stateDir is recreated with its lock and the epoch high-water mark (a
// WARN); one that cannot be written fails readiness with the reason (an
// ERROR, then every minute), as does a halted epoch. The state loop only.
func (o *Operator) checkState() {
	defer o.stateChecks.Add(1)
	now := o.clk.Now()
	loud := now.Sub(o.stateWarned) >= stateWarnEvery
	if o.state.Halted != "" {
		if loud {
			o.log.Error("not publishing: "+o.state.Halted, "state", o.state.path, "publisher_epoch", o.state.Epoch)
			o.stateWarned = now
		}
		return
	}
	recreated, err := o.state.Ensure()
	trouble := ""
	switch {
	case err != nil:
		trouble = "stateDir cannot be written: " + err.Error()
		if loud {
			o.log.Error("the operator cannot keep its state; readiness fails until it can", "state", o.state.path, "err", err)
			o.stateWarned = now
		}
	case recreated:
		o.log.Warn("stateDir was deleted while the operator ran; recreated it with the publisher epoch", "state", o.state.path, "publisher_epoch", o.state.Epoch)
	}
	o.stateTrouble.Store(&trouble)
}

// maxRunning is the most requests one ready unit of the provider runs at
// once: as configured, else as its engine declares it; ok is false when
// neither says it.
func maxRunning(cfg *config.Provider, load *backend.Load) (float64, bool) {
	switch {
	case cfg.MaxRunning > 0:
		return float64(cfg.MaxRunning), true
	case load.MaxRunning != nil:
		return *load.MaxRunning, true
	}
	return 0, false
}
