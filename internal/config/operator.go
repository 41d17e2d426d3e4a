// Package config holds the YAML schemas of the operator and the gateway, their
// defaults and their validation. Files are decoded strictly: an unknown key is
// an error naming the key, the file and the line, and validation reports every
// problem at once, each with the line it comes from.
package config

import (
	"slices"
	"time"
)

// Operator is the configuration of `grid operator`.
type Operator struct {
	// Site is this site's name, a DNS-1123 label; it is the site's SPIFFE
	// identity (spiffe://<trustDomain>/site/<site>) and the grid_site label.
	Site string `yaml:"site"`
	// TrustDomain is the SPIFFE trust domain of the grid.
	TrustDomain string `yaml:"trustDomain"`
	// TLS is the site's certificate material. Without it the operator scrapes
	// and serves /metrics but serves no signals and polls no peers: there is
	// no plaintext signals path.
	TLS *TLS `yaml:"tls"`
	// Signals is the mTLS listener peers and the local gateway read from.
	Signals Listener `yaml:"signals"`
	// Metrics is the plain listener for /metrics, /healthz and /readyz.
	Metrics Listener `yaml:"metrics"`
	// ScrapeInterval is how often a provider is scraped, unless its
	// metrics.interval says otherwise.
	ScrapeInterval Duration `yaml:"scrapeInterval"`
	// ScrapeConcurrency bounds how many providers are scraped at once.
	ScrapeConcurrency int `yaml:"scrapeConcurrency"`
	// SignalsTTL is how long this site's own rows are served after collection.
	SignalsTTL Duration `yaml:"signalsTTL"`
	// PeerPollInterval is how often every peer is polled.
	PeerPollInterval Duration `yaml:"peerPollInterval"`
	// PeerPoll tunes the peer poller.
	PeerPoll PeerPoll `yaml:"peerPoll"`
	// StateDir holds what must survive a restart (the publisher-epoch high
	// water mark, provider uids and generations).
	StateDir string `yaml:"stateDir"`
	// Peers are the other sites of the grid.
	Peers []Peer `yaml:"peers"`
	// Membership, when set, joins the grid's SWIM gossip cluster: the
	// members alive become poll targets in addition to Peers.
	Membership *Membership `yaml:"membership"`
	// Providers are this site's inference backends.
	Providers []Provider `yaml:"providers"`
	// Deprecated says, for each key the file wrote in an old spelling,
	// where and what it is called now (`file:line: "old" is deprecated; it
	// is now "new"`): the key was read, and the caller warns.
	Deprecated []string `yaml:"-"`
}

// TLS names the PEM files of a site identity and the grid CA.
type TLS struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// ReloadInterval is how often the files are re-read, so a renewed
	// certificate is used for new connections without a restart.
	ReloadInterval Duration `yaml:"reloadInterval"`
	// At says where each file was named, for errors about the file: the
	// key's path and its line ("tls.cert at east.yaml:4"). Not part of
	// what the block means (SameFiles ignores it).
	At TLSAt `yaml:"-"`
}

// TLSAt is where a TLS block's files were named.
type TLSAt struct{ CA, Cert, Key string }

// SameFiles reports whether t and o name the same files and reload them
// alike, wherever in their configuration files they were named.
func (t TLS) SameFiles(o TLS) bool {
	t.At, o.At = TLSAt{}, TLSAt{}
	return t == o
}

// locate records where the block's keys are, under path ("tls").
func (t *TLS) locate(doc *document, path string) {
	if t == nil || doc == nil {
		return
	}
	at := func(key string) string {
		k := path + "." + key
		if where, ok := doc.line(k); ok {
			return k + " at " + where
		}
		return k
	}
	t.At = TLSAt{CA: at("ca"), Cert: at("cert"), Key: at("key")}
}

// DefaultTLSReloadInterval is how often certificate files are re-read.
const DefaultTLSReloadInterval = 30 * time.Second

// Listener is an address to listen on.
type Listener struct {
	Listen string `yaml:"listen"`
}

// PeerPoll tunes peer polling (docs/protocol.md §4.7).
type PeerPoll struct {
	// Timeout bounds one attempt, headers and body.
	Timeout Duration `yaml:"timeout"`
	// Attempts is how many tries one peer gets per round.
	Attempts int `yaml:"attempts"`
	// Backoff is the base delay between attempts.
	Backoff Duration `yaml:"backoff"`
	// Budget bounds one peer's whole round, all attempts included.
	Budget Duration `yaml:"budget"`
	// Concurrency bounds how many peers are polled at once.
	Concurrency int `yaml:"concurrency"`
	// TTL is how long a peer's rows are kept after they were polled.
	TTL Duration `yaml:"ttl"`
	// Slow is the poll duration, retries included, from which a poll
	// counts in grid_peer_poll_slow_total.
	Slow Duration `yaml:"slow"`
}

// Peer is another site of the grid.
type Peer struct {
	// Site is the peer's site name; its certificate must carry that identity.
	Site string `yaml:"site"`
	// Signals is the base URL of the peer operator's signals listener.
	Signals string `yaml:"signals"`
	// Gateway is the base URL of the peer gateway's hop listener, where this
	// site's gateway forwards requests it routes to that site.
	Gateway string `yaml:"gateway"`
	// Models, when set, restricts what the peer may read of this site and
	// route to it: the providers of these models only. Absent, the peer may
	// use every provider; an empty list, none.
	Models []string `yaml:"models"`
}

// Equal reports whether p and o are the same peer configuration.
func (p Peer) Equal(o Peer) bool {
	return p.Site == o.Site && p.Signals == o.Signals && p.Gateway == o.Gateway &&
		(p.Models == nil) == (o.Models == nil) && slices.Equal(p.Models, o.Models)
}

// MayUse reports whether the peer may read and route to a provider of
// model.
func (p Peer) MayUse(model string) bool { return p.Models == nil || slices.Contains(p.Models, model) }

// Membership is this operator's place in the grid's gossip cluster
// (internal/membership). A configured peer of the same site wins over what
// gossip says of it.
type Membership struct {
	// Bind is the gossip listener, host:port, UDP and TCP.
	Bind string `yaml:"bind"`
	// Advertise is the host:port other members reach this one at; empty
	// uses Bind's (or, for a wildcard bind, a private address of this host).
	Advertise string `yaml:"advertise"`
	// Seeds are members to join through, host:port.
	Seeds []string `yaml:"seeds"`
	// KeyFile holds the gossip key: base64 of 16, 24 or 32 bytes. Required:
	// peers found through unencrypted gossip would be polled on anyone's
	// say-so.
	KeyFile string `yaml:"keyFile"`
	// Signals is the https URL of this operator's signals listener that
	// other members poll.
	Signals string `yaml:"signals"`
	// Gateway is the https URL of this site's gateway hop listener that
	// other sites' gateways forward to.
	Gateway string `yaml:"gateway"`
	// Profile is memberlist's timing preset, one of MembershipProfiles.
	Profile string `yaml:"profile"`
}

// MembershipProfiles are memberlist's timing presets: lan (probe every
// second, a dead member declared within seconds), wan (slower probes,
// longer suspicion, for members across the internet), local (loopback).
var MembershipProfiles = []string{"lan", "wan", "local"}

// Provider is one inference backend of this site: an llm-d EPP pool or an
// engine (vLLM, SGLang).
type Provider struct {
	// Name is the provider's routing identity (the grid_provider label), a
	// DNS-1123 label.
	Name string `yaml:"name"`
	// Model is the model name clients ask for.
	Model string `yaml:"model"`
	// Kind is epp, vllm, sglang, auto, or generic (an engine read through
	// /v1/loads only).
	Kind string `yaml:"kind"`
	// Metrics says where and how to scrape the provider's load.
	Metrics Metrics `yaml:"metrics"`
	// Upstream is where this site's gateway forwards the provider's requests.
	Upstream string `yaml:"upstream"`
	// Unavailable marks the provider out of service: it is published not ready
	// whatever its metrics say.
	Unavailable bool `yaml:"unavailable"`
	// Admission is new_and_existing (the default), existing_only (keeps
	// the sessions bound to it, takes no new one: a graceful drain) or
	// none; relayed to every gateway (docs/protocol.md §2.2).
	Admission string `yaml:"admission"`
	// MaxRunning is the most requests one ready unit of the provider (an
	// endpoint of a pool, an engine) runs at once: vLLM's --max-num-seqs,
	// SGLang's --max-running-requests, times the data-parallel ranks of a
	// server read as one engine. Relayed to every gateway, which then
	// reads no more undemonstrated capacity into a unit than this
	// (docs/routing.md, capacity); 0 relays what the engine declares, if
	// anything. Omitted when 0, so adding the key changed no provider's
	// config hash (its generation).
	MaxRunning int `yaml:"maxRunning,omitempty"`
	// Object is the provider's revision when it is declared by a Kubernetes
	// object: peers order its batches by metadata.uid and
	// metadata.generation. Nil in file mode, where the operator's state mints
	// them. Not a configuration key.
	Object *ObjectRevision `yaml:"-"`
}

// ObjectRevision identifies one version of a provider's Kubernetes object.
type ObjectRevision struct {
	UID        string
	Generation int64
}

// Provider kinds.
const (
	KindEPP    = "epp"
	KindVLLM   = "vllm"
	KindSGLang = "sglang"
	KindAuto   = "auto"
	// KindGeneric is an engine with no gauge schema: /v1/loads or nothing.
	KindGeneric = "generic"
)

// Metrics is how a provider is scraped.
type Metrics struct {
	// Endpoint is the base URL of the metrics server.
	Endpoint string `yaml:"endpoint"`
	// Path is the exposition path on Endpoint.
	Path string `yaml:"path"`
	// PoolName keeps only EPP series whose pool label (name, or
	// inference_pool for flow control) equals it; empty keeps every pool.
	PoolName string `yaml:"poolName"`
	// Timeout bounds one scrape.
	Timeout Duration `yaml:"timeout"`
	// Interval is how often this provider is scraped; zero means the
	// operator's scrapeInterval.
	Interval Duration `yaml:"interval"`
	// RefreshInterval is how often the backend recomputes the gauges it
	// serves (the EPP's --refresh-prometheus-metrics-interval, 5 s by
	// default); zero means they are live, as an engine's are. A scrape
	// reads values computed, on average, half of it earlier, and its
	// readings are stamped so.
	RefreshInterval Duration `yaml:"refreshInterval"`
	// BearerTokenFile holds a token sent as Authorization: Bearer.
	BearerTokenFile string `yaml:"bearerTokenFile"`
	// TLS configures HTTPS scraping.
	TLS *ClientTLS `yaml:"tls"`
	// StaleAfter is how long without a successful scrape before the provider
	// is declared not ready. Zero means half the signals TTL.
	StaleAfter Duration `yaml:"staleAfter"`
}

// ClientTLS is the TLS a scraper presents to and expects from a backend.
type ClientTLS struct {
	// CA verifies the server; empty means the system roots.
	CA string `yaml:"ca"`
	// Cert and Key are an optional client certificate.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// ServerName overrides the name checked in the server certificate.
	ServerName string `yaml:"serverName"`
	// InsecureSkipVerify disables server verification (development only).
	InsecureSkipVerify bool `yaml:"insecureSkipVerify"`
}

// Operator defaults.
const (
	DefaultTrustDomain       = "grid.internal"
	DefaultSignalsListen     = "127.0.0.1:9091"
	DefaultOperatorMetrics   = "127.0.0.1:9090"
	DefaultScrapeInterval    = time.Second
	DefaultScrapeConcurrency = 16
	DefaultSignalsTTL        = 30 * time.Second
	DefaultPeerPollInterval  = 5 * time.Second
	DefaultPeerTimeout       = 2 * time.Second
	DefaultPeerAttempts      = 3
	DefaultPeerBackoff       = 50 * time.Millisecond
	DefaultPeerBudget        = 10 * time.Second
	DefaultPeerConcurrency   = 8
	DefaultPeerTTL           = 120 * time.Second
	DefaultPeerSlow          = time.Second
	DefaultMetricsPath       = "/metrics"
	DefaultMembershipBind    = "0.0.0.0:7946"
	DefaultScrapeTimeout     = 2 * time.Second
)

func (c *Operator) applyDefaults() {
	setString(&c.TrustDomain, DefaultTrustDomain)
	c.TLS.applyDefaults()
	setString(&c.Signals.Listen, DefaultSignalsListen)
	setString(&c.Metrics.Listen, DefaultOperatorMetrics)
	setDuration(&c.ScrapeInterval, DefaultScrapeInterval)
	setInt(&c.ScrapeConcurrency, DefaultScrapeConcurrency)
	setDuration(&c.SignalsTTL, DefaultSignalsTTL)
	setDuration(&c.PeerPollInterval, DefaultPeerPollInterval)
	setDuration(&c.PeerPoll.Timeout, DefaultPeerTimeout)
	setInt(&c.PeerPoll.Attempts, DefaultPeerAttempts)
	setDuration(&c.PeerPoll.Backoff, DefaultPeerBackoff)
	setDuration(&c.PeerPoll.Budget, DefaultPeerBudget)
	setInt(&c.PeerPoll.Concurrency, DefaultPeerConcurrency)
	setDuration(&c.PeerPoll.TTL, DefaultPeerTTL)
	setDuration(&c.PeerPoll.Slow, DefaultPeerSlow)
	if m := c.Membership; m != nil {
		setString(&m.Bind, DefaultMembershipBind)
		setString(&m.Profile, "lan")
	}
	if c.StateDir == "" && c.Site != "" {
		c.StateDir = "state/" + c.Site
	}
	for i := range c.Providers {
		p := &c.Providers[i]
		setString(&p.Kind, KindEPP)
		setString(&p.Metrics.Path, DefaultMetricsPath)
		setDuration(&p.Metrics.Timeout, DefaultScrapeTimeout)
	}
}

// ScrapeIntervalOf is how often p is scraped: its own metrics.interval,
// else scrapeInterval.
func (c *Operator) ScrapeIntervalOf(p *Provider) time.Duration {
	if p.Metrics.Interval > 0 {
		return p.Metrics.Interval.D()
	}
	return c.ScrapeInterval.D()
}

// StaleAfter is the provider's readiness stale window: its own setting, else
// half the signals TTL.
func (c *Operator) StaleAfter(p *Provider) time.Duration {
	if p.Metrics.StaleAfter > 0 {
		return p.Metrics.StaleAfter.D()
	}
	return c.SignalsTTL.D() / 2
}

func setString(s *string, def string) {
	if *s == "" {
		*s = def
	}
}

func setInt(i *int, def int) {
	if *i == 0 {
		*i = def
	}
}

func (t *TLS) applyDefaults() {
	if t != nil {
		setDuration(&t.ReloadInterval, DefaultTLSReloadInterval)
	}
}

func setDuration(d *Duration, def time.Duration) {
	if *d == 0 {
		*d = Duration(def)
	}
}
