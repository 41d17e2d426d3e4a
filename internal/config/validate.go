package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/grid-inference/grid/internal/peeraddr"
	"github.com/grid-inference/grid/internal/signals"
)

var (
	trustDomain = regexp.MustCompile(`^[a-z0-9._-]+$`)
)

// problems collects validation errors, each tied to the line of its key.
type problems struct {
	doc  *document
	errs []error
}

func (p *problems) addf(path, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s: %s", p.doc.at(path), path, fmt.Sprintf(format, args...)))
}

func (p *problems) err() error { return errors.Join(p.errs...) }

func (p *problems) label(path, v string) {
	switch {
	case v == "":
		p.addf(path, "required")
	case !signals.IsDNS1123Label(v):
		p.addf(path, "%q is not a DNS-1123 label (1-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit)", v)
	}
}

func (p *problems) listen(path, v string) {
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		p.addf(path, "%q is not a host:port address", v)
	}
}

// url checks an absolute URL with one of the allowed schemes.
func (p *problems) url(path, v string, required bool, schemes ...string) {
	if v == "" {
		if required {
			p.addf(path, "required")
		}
		return
	}
	u, err := url.Parse(v)
	if err != nil {
		p.addf(path, "invalid URL %q: %v", v, err)
		return
	}
	ok := false
	for _, s := range schemes {
		ok = ok || u.Scheme == s
	}
	if !ok {
		p.addf(path, "URL %q must use %s", v, strings.Join(schemes, " or "))
		return
	}
	if u.Host == "" {
		p.addf(path, "URL %q has no host", v)
	}
	if u.User != nil {
		p.addf(path, "URL %q must not carry credentials", v)
	}
}

func (p *problems) positive(path string, d Duration) {
	if d <= 0 {
		p.addf(path, "must be a positive duration, got %s", d)
	}
}

func (p *problems) atLeast(path string, v, least int) {
	if v < least {
		p.addf(path, "must be at least %d, got %d", least, v)
	}
}

func (p *problems) tls(path string, t *TLS) {
	if t == nil {
		return
	}
	for _, f := range []struct{ key, v string }{{"ca", t.CA}, {"cert", t.Cert}, {"key", t.Key}} {
		if f.v == "" {
			p.addf(path+"."+f.key, "required when %s is set", path)
		}
	}
	p.positive(path+".reloadInterval", t.ReloadInterval)
}

func (p *problems) trustDomain(path, v string) {
	if !trustDomain.MatchString(v) {
		p.addf(path, "%q is not a SPIFFE trust domain (lowercase letters, digits, '.', '-', '_')", v)
	}
}

func (p *problems) membership(m *Membership, haveTLS bool) {
	if !haveTLS {
		p.addf("membership", "members are polled over mutual TLS only: set tls (ca, cert, key)")
	}
	p.listen("membership.bind", m.Bind)
	if m.Advertise != "" {
		p.listen("membership.advertise", m.Advertise)
	}
	for i, s := range m.Seeds {
		if _, _, err := net.SplitHostPort(s); err != nil {
			p.addf(fmt.Sprintf("membership.seeds[%d]", i), "%q is not host:port", s)
		}
	}
	if m.KeyFile == "" {
		p.addf("membership.keyFile", "required: gossip is encrypted or not used (grid certs gossip-key writes a key)")
	}
	if m.Signals == "" {
		p.addf("membership.signals", "required: the https URL other members poll this operator at")
	} else if err := peeraddr.Check(m.Signals); err != nil {
		p.addf("membership.signals", "other members would refuse it: %v", err)
	}
	if m.Gateway != "" {
		if err := peeraddr.Check(m.Gateway); err != nil {
			p.addf("membership.gateway", "other members would refuse it: %v", err)
		}
	}
	if !slices.Contains(MembershipProfiles, m.Profile) {
		p.addf("membership.profile", "%q is not one of %v", m.Profile, MembershipProfiles)
	}
}

func (c *Operator) validate(doc *document) error {
	p := &problems{doc: doc}
	p.label("site", c.Site)
	p.trustDomain("trustDomain", c.TrustDomain)
	p.tls("tls", c.TLS)
	p.listen("signals.listen", c.Signals.Listen)
	p.listen("metrics.listen", c.Metrics.Listen)
	p.positive("scrapeInterval", c.ScrapeInterval)
	p.atLeast("scrapeConcurrency", c.ScrapeConcurrency, 1)
	p.positive("signalsTTL", c.SignalsTTL)
	p.positive("peerPollInterval", c.PeerPollInterval)
	p.positive("peerPoll.timeout", c.PeerPoll.Timeout)
	p.atLeast("peerPoll.attempts", c.PeerPoll.Attempts, 1)
	p.positive("peerPoll.backoff", c.PeerPoll.Backoff)
	p.positive("peerPoll.budget", c.PeerPoll.Budget)
	p.atLeast("peerPoll.concurrency", c.PeerPoll.Concurrency, 1)
	p.positive("peerPoll.ttl", c.PeerPoll.TTL)
	p.positive("peerPoll.slow", c.PeerPoll.Slow)
	if c.StateDir == "" {
		p.addf("stateDir", "required")
	}
	if len(c.Peers) > 0 && c.TLS == nil {
		p.addf("peers", "peers are polled over mutual TLS only: set tls (ca, cert, key)")
	}
	sites := map[string]bool{}
	for i, peer := range c.Peers {
		path := fmt.Sprintf("peers[%d]", i)
		p.label(path+".site", peer.Site)
		switch {
		case peer.Site != "" && peer.Site == c.Site:
			p.addf(path+".site", "%q is this site; a site does not poll itself", peer.Site)
		case sites[peer.Site]:
			p.addf(path+".site", "%q is listed twice", peer.Site)
		}
		sites[peer.Site] = true
		p.url(path+".signals", peer.Signals, true, "https")
		p.url(path+".gateway", peer.Gateway, false, "https")
		for j, m := range peer.Models {
			if m == "" {
				p.addf(fmt.Sprintf("%s.models[%d]", path, j), "empty model name")
			}
		}
	}
	if m := c.Membership; m != nil {
		p.membership(m, c.TLS != nil)
	}
	names := map[string]bool{}
	for i := range c.Providers {
		pr := &c.Providers[i]
		path := fmt.Sprintf("providers[%d]", i)
		p.label(path+".name", pr.Name)
		if names[pr.Name] {
			p.addf(path+".name", "%q is listed twice", pr.Name)
		}
		names[pr.Name] = true
		if pr.Model == "" {
			p.addf(path+".model", "required")
		}
		switch pr.Kind {
		case KindEPP, KindVLLM, KindSGLang, KindAuto, KindGeneric:
		default:
			p.addf(path+".kind", "%q is not one of epp, vllm, sglang, auto, generic", pr.Kind)
		}
		p.url(path+".metrics.endpoint", pr.Metrics.Endpoint, true, "http", "https")
		if strings.ContainsAny(pr.Metrics.Path, "?# ") {
			p.addf(path+".metrics.path", "%q must be a plain path", pr.Metrics.Path)
		}
		p.positive(path+".metrics.timeout", pr.Metrics.Timeout)
		if pr.Metrics.Interval < 0 {
			p.addf(path+".metrics.interval", "must not be negative")
		}
		if pr.Metrics.RefreshInterval < 0 {
			p.addf(path+".metrics.refreshInterval", "must not be negative")
		}
		if pr.Metrics.StaleAfter < 0 {
			p.addf(path+".metrics.staleAfter", "must not be negative")
		}
		if t := pr.Metrics.TLS; t != nil && (t.Cert == "") != (t.Key == "") {
			p.addf(path+".metrics.tls", "cert and key go together")
		}
		p.url(path+".upstream", pr.Upstream, true, "http", "https")
		if _, ok := signals.ParseAdmission(pr.Admission); !ok {
			p.addf(path+".admission", "%q is not one of new_and_existing, existing_only, none", pr.Admission)
		}
		if pr.MaxRunning < 0 {
			p.addf(path+".maxRunning", "must not be negative")
		}
	}
	return p.err()
}

func (c *Gateway) validate(doc *document) error {
	p := &problems{doc: doc}
	p.label("site", c.Site)
	p.trustDomain("trustDomain", c.TrustDomain)
	if c.TLS == nil {
		p.addf("tls", "required: the gateway reads its operator and forwards to peers over mutual TLS")
	}
	p.tls("tls", c.TLS)
	p.listen("listen", c.Listen)
	p.listen("hop.listen", c.Hop.Listen)
	p.listen("metrics.listen", c.Metrics.Listen)
	p.url("operator.signals", c.Operator.Signals, true, "https")
	p.positive("pollInterval", c.PollInterval)
	p.positive("idleAfter", c.IdleAfter)
	p.positive("forgetAfter", c.ForgetAfter)
	p.atLeast("limits.clientConns", c.Limits.ClientConns, 0)
	p.atLeast("limits.clientConnsPerSource", c.Limits.ClientConnsPerSource, 0)
	p.atLeast("limits.hopConns", c.Limits.HopConns, 0)
	p.atLeast("limits.hopConnsPerSource", c.Limits.HopConnsPerSource, 0)
	p.positive("limits.bodyReadTimeout", c.Limits.BodyReadTimeout)
	if c.Limits.BodyBytes < 0 {
		p.addf("limits.bodyBytes", "must not be negative (0 derives it from the memory limit), got %d", c.Limits.BodyBytes)
	}
	p.positive("upstream.connectTimeout", c.Upstream.ConnectTimeout)
	p.positive("upstream.responseHeaderTimeout", c.Upstream.ResponseHeaderTimeout)
	p.positive("limits.headerReadTimeout", c.Limits.HeaderReadTimeout)
	p.positive("limits.clientIdleTimeout", c.Limits.ClientIdleTimeout)
	if d := c.Limits.DetachAfter; d != nil && *d < 0 {
		p.addf("limits.detachAfter", "must not be negative, got %s", d.D())
	}
	a := c.Availability
	inRange := func(path string, v, lo, hi float64) {
		if math.IsNaN(v) || v < lo || v > hi {
			p.addf(path, "must be in [%g, %g], got %g", lo, hi, v)
		}
	}
	inRange("availability.smoothing", *a.Smoothing, math.SmallestNonzeroFloat64, 1)
	if *a.CeilingHalfLifeMs <= 0 {
		p.addf("availability.ceiling_half_life_ms", "must be positive, got %d", *a.CeilingHalfLifeMs)
	}
	inRange("availability.ceiling_floor", *a.CeilingFloor, 1, math.MaxFloat64)
	inRange("availability.explore_floor", *a.ExploreFloor, 0, 1)
	if *a.FullAfterMs < 0 {
		p.addf("availability.full_after_ms", "must not be negative, got %d", *a.FullAfterMs)
	}
	if *a.RoomAfterMs < 0 {
		p.addf("availability.room_after_ms", "must not be negative, got %d", *a.RoomAfterMs)
	}
	inRange("availability.queue_full", *a.QueueFull, 0, math.MaxFloat64)
	if a.HoldWhenFull < 0 {
		p.addf("availability.holdWhenFull", "must not be negative, got %s", a.HoldWhenFull.D())
	}
	if a.Policy != PolicyAgeAware && a.Policy != PolicyReference && a.Policy != PolicyLatency {
		p.addf("availability.policy", "%q is not age-aware, latency or reference", a.Policy)
	}
	if a.CeilingModel != CeilingBounds && a.CeilingModel != CeilingSingle {
		p.addf("availability.ceilingModel", "%q is not bounds or single", a.CeilingModel)
	}
	af := c.Affinity
	if af.Header != "" && !validToken(af.Header) {
		p.addf("affinity.header", "%q is not a header name", af.Header)
	}
	if af.Cookie != "" && !validToken(af.Cookie) {
		p.addf("affinity.cookie", "%q is not a cookie name", af.Cookie)
	}
	if af.TTL <= 0 || af.TTL.D() > MaxAffinityTTL {
		p.addf("affinity.ttl", "must be positive and at most 24h, got %s", af.TTL.D())
	}
	inRange("affinity.threshold", *af.Threshold, math.SmallestNonzeroFloat64, 10)
	p.atLeast("affinity.maxSessions", af.MaxSessions, 1)
	if af.MaxBytes < 4096 {
		p.addf("affinity.maxBytes", "must be at least 4096, got %d", af.MaxBytes)
	}
	if af.Prefix.Bytes < 16 || af.Prefix.Bytes > 1<<20 {
		p.addf("affinity.prefix.bytes", "must be in [16, 1048576], got %d", af.Prefix.Bytes)
	}
	inRange("affinity.prefix.exploration", *af.Prefix.Exploration, 0, 1)
	return p.err()
}

// validToken reports whether s is an HTTP token (RFC 9110 §5.6.2), what
// header and cookie names are made of.
func validToken(s string) bool {
	for _, r := range s {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return s != ""
}
