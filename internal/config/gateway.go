package config

import "time"

// Gateway is the configuration of `grid gateway`.
type Gateway struct {
	// Site is this site's name; the gateway's certificate names it and its
	// operator must present the same identity.
	Site string `yaml:"site"`
	// TrustDomain is the SPIFFE trust domain of the grid.
	TrustDomain string `yaml:"trustDomain"`
	// Listen is the client listener (the OpenAI API).
	Listen string `yaml:"listen"`
	// Hop is the mTLS listener for requests forwarded by peer gateways.
	Hop Listener `yaml:"hop"`
	// Metrics is the plain listener for /metrics, /healthz, /readyz and /ui.
	Metrics Listener `yaml:"metrics"`
	// ReusePort binds the three listeners with SO_REUSEPORT, so that a
	// replacement gateway can bind them while the one it replaces drains
	// (docs/operations.md, restarting in place).
	ReusePort bool `yaml:"reusePort"`
	// Operator is this site's operator.
	Operator OperatorRef `yaml:"operator"`
	// TLS is the site's certificate material.
	TLS *TLS `yaml:"tls"`
	// PollInterval is how often the operator's signals are read while serving.
	PollInterval Duration `yaml:"pollInterval"`
	// IdleAfter stops polling after this long without a request; the next
	// request resumes it.
	IdleAfter Duration `yaml:"idleAfter"`
	// ForgetAfter drops a remote provider from the candidate list once no
	// row of it has arrived for this long (its site was removed, or it was
	// removed from its site); until then it stays, unmeasured, sorted last.
	ForgetAfter Duration `yaml:"forgetAfter"`
	// Availability tunes the snapshot's capacity learning and shedding.
	Availability Availability `yaml:"availability"`
	// Limits bound what clients and peer gateways may hold.
	Limits GatewayLimits `yaml:"limits"`
	// Upstream bounds the gateway's exchanges with where it sends requests:
	// this site's providers and peer sites' gateways.
	Upstream Upstream `yaml:"upstream"`
	// Affinity keeps a conversation where its KV cache lives
	// (docs/routing.md, affinity); off unless a header, a cookie or prefix
	// affinity is set.
	Affinity Affinity `yaml:"affinity"`
	// Deprecated says, for each key the file wrote in an old spelling,
	// where and what it is called now (`file:line: "old" is deprecated; it
	// is now "new"`): the key was read, and the caller warns.
	Deprecated []string `yaml:"-"`
}

// Affinity configures session and prefix affinity.
type Affinity struct {
	// Header and Cookie name where a request's session key is read: the
	// header first, then the cookie. Neither set: no session affinity.
	Header string `yaml:"header"`
	Cookie string `yaml:"cookie"`
	// TTL is how long a session stays bound after its last request (at
	// most 24 h).
	TTL Duration `yaml:"ttl"`
	// Threshold is the load (in-flight over learned capacity, read through
	// its age as the default policy reads it) at which a bound site yields
	// to the normal pick when another site reads below it
	// (route.Snapshot.Keep), and a preferred one always (Prefer).
	Threshold *float64 `yaml:"threshold"`
	// MaxSessions and MaxBytes bound the session table; the least recently
	// used session goes first.
	MaxSessions int   `yaml:"maxSessions"`
	MaxBytes    int64 `yaml:"maxBytes"`
	// Prefix maps a prompt's leading part to a preferred site.
	Prefix PrefixAffinity `yaml:"prefix"`
}

// On reports whether any affinity is configured.
func (a *Affinity) On() bool { return a.Header != "" || a.Cookie != "" || a.Prefix.Enabled }

// PrefixAffinity configures prefix affinity for requests without a
// session key.
type PrefixAffinity struct {
	Enabled bool `yaml:"enabled"`
	// Bytes bounds the leading part of the prompt that is hashed.
	Bytes int `yaml:"bytes"`
	// Exploration is the share of prefixed requests routed by the normal
	// pick anyway, so the load readings of every site stay current.
	Exploration *float64 `yaml:"exploration"`
}

// Upstream bounds an attempt to deliver a request.
type Upstream struct {
	// ConnectTimeout bounds connecting to an upstream, TLS handshake
	// included. Past it nothing reached the upstream, so the request is
	// tried once elsewhere.
	ConnectTimeout Duration `yaml:"connectTimeout"`
	// ResponseHeaderTimeout bounds the wait for an upstream's response
	// headers once the request was sent. An engine sends a non-streaming
	// completion's headers only when the completion is done, so this must
	// cover the longest completion plus its queueing.
	ResponseHeaderTimeout Duration `yaml:"responseHeaderTimeout"`
}

// GatewayLimits bound the client and hop listeners, so that one source
// opening connections or trickling a body cannot take the gateway from
// everyone else.
type GatewayLimits struct {
	// ClientConns bounds the client listener's open connections.
	ClientConns int `yaml:"clientConns"`
	// ClientConnsPerSource bounds one client address's (or IPv6 /64's)
	// connections; 0 is no per-source bound, the default, because clients
	// behind a load balancer or NAT share an address.
	ClientConnsPerSource int `yaml:"clientConnsPerSource"`
	// HopConns bounds the hop listener's open connections.
	HopConns int `yaml:"hopConns"`
	// HopConnsPerSource bounds one peer address's (or IPv6 /64's)
	// connections, so one peer cannot take the hop listener from the
	// others.
	HopConnsPerSource int `yaml:"hopConnsPerSource"`
	// BodyReadTimeout bounds reading a request's body.
	BodyReadTimeout Duration `yaml:"bodyReadTimeout"`
	// HeaderReadTimeout bounds reading a request's headers (and, on the hop
	// listener, the TLS handshake before them).
	HeaderReadTimeout Duration `yaml:"headerReadTimeout"`
	// ClientIdleTimeout closes a client's keep-alive connection idle this
	// long.
	ClientIdleTimeout Duration `yaml:"clientIdleTimeout"`
	// BodyBytes bounds the request bodies the gateway holds in memory at
	// once, across every connection; 0 derives it from the memory limit
	// (docs/gateway.md).
	BodyBytes int64 `yaml:"bodyBytes"`
	// DetachStreams copies SSE answers off the HTTP server's goroutines
	// once their first bytes have come (docs/gateway.md, detached
	// streams); nil is on. A reload applies it to the streams that start
	// after it.
	DetachStreams *bool `yaml:"detachStreams"`
	// DetachAfter is how long a stream is copied by the server before it
	// is detached, at its first event after that; nil is
	// DefaultDetachAfter, 0 detaches at the first event (docs/gateway.md,
	// detached streams).
	DetachAfter *Duration `yaml:"detachAfter"`
}

// Detach reports whether SSE answers are detached (limits.detachStreams).
func (l *GatewayLimits) Detach() bool { return l.DetachStreams == nil || *l.DetachStreams }

// DetachDelay is limits.detachAfter, or its default when unset.
func (l *GatewayLimits) DetachDelay() time.Duration {
	if l.DetachAfter == nil {
		return DefaultDetachAfter
	}
	return l.DetachAfter.D()
}

// OperatorRef locates the local operator.
type OperatorRef struct {
	// Signals is the base URL of the operator's signals listener.
	Signals string `yaml:"signals"`
}

// Availability holds the snapshot knobs of docs/protocol.md §3.4. Key names follow
// the reference's filter block so that tuning guides apply unchanged.
type Availability struct {
	Shedding          bool     `yaml:"shedding"`
	Smoothing         *float64 `yaml:"smoothing"`
	CeilingHalfLifeMs *int64   `yaml:"ceiling_half_life_ms"`
	CeilingFloor      *float64 `yaml:"ceiling_floor"`
	ExploreFloor      *float64 `yaml:"explore_floor"`
	FullAfterMs       *int64   `yaml:"full_after_ms"`
	RoomAfterMs       *int64   `yaml:"room_after_ms"`
	QueueFull         *float64 `yaml:"queue_full"`
	// CeilingModel is "bounds" (the seed's soft and hard capacity bounds
	// with the KV-cache term) or "single" (the reference code's one decayed
	// ceiling), kept so the two can be compared.
	CeilingModel string `yaml:"ceilingModel" was:"ceiling_model"`
	// Policy is "age-aware" (read each site's load through its age),
	// "latency" (pick by predicted time to first token, round trips and
	// request sizes included) or "reference" (the reference system's
	// selection, exactly).
	Policy string `yaml:"policy"`
	// HoldWhenFull is how long a client's request may wait at the gateway
	// while every site of its model is full by the gateway's own count,
	// for the first site to have room (docs/gateway.md); 0 sends it at
	// once, to wait in a site's queue.
	HoldWhenFull Duration `yaml:"holdWhenFull"`
}

// Selection policies.
const (
	PolicyAgeAware  = "age-aware"
	PolicyReference = "reference"
	PolicyLatency   = "latency"
)

// Ceiling models.
const (
	CeilingBounds = "bounds"
	CeilingSingle = "single"
)

// Gateway defaults.
const (
	DefaultGatewayListen  = "127.0.0.1:8080"
	DefaultHopListen      = "127.0.0.1:8081"
	DefaultGatewayMetrics = "127.0.0.1:8082"
	DefaultPollInterval   = time.Second
	DefaultIdleAfter      = 5 * time.Minute
	DefaultForgetAfter    = 5 * time.Minute

	DefaultSmoothing         = 0.3
	DefaultCeilingHalfLifeMs = 600_000
	DefaultCeilingFloor      = 8.0
	DefaultExploreFloor      = 0.25
	DefaultFullAfterMs       = 5000
	DefaultRoomAfterMs       = 2000
	DefaultQueueFull         = 1.0

	DefaultClientConns       = 4096
	DefaultHopConns          = 1024
	DefaultHopConnsPerSource = 256
	DefaultBodyReadTimeout   = 30 * time.Second
	DefaultHeaderReadTimeout = 10 * time.Second
	// DefaultClientIdleTimeout: clients of an LLM API send bursts; a
	// keep-alive reused within 30 s saves a handshake, one idle longer holds
	// a slot of limits.clientConns that a new client may need.
	DefaultClientIdleTimeout = 30 * time.Second
	// DefaultDetachAfter: detaching a stream saves memory for as long as
	// it lasts and costs the hijack and the connection's return once; a
	// stream shorter than a second is not worth it (BENCHMARKS.md, CPU
	// per request).
	DefaultDetachAfter = time.Second

	// DefaultUpstreamConnectTimeout: a connection on a network between
	// sites is made in well under a second; two leaves room for a loaded
	// peer's handshake and stays short enough that a hung peer costs a
	// client little before the request goes elsewhere.
	DefaultUpstreamConnectTimeout = 2 * time.Second
	// DefaultUpstreamResponseHeaderTimeout: a non-streaming completion of
	// a few thousand tokens at tens of tokens per second, behind a queue,
	// answers its headers after minutes.
	DefaultUpstreamResponseHeaderTimeout = 5 * time.Minute

	// DefaultAffinityTTL: a chat's next turn comes within minutes; an hour
	// covers a working session's pauses. An engine's prefix cache rarely
	// holds a conversation longer than that under load.
	DefaultAffinityTTL = time.Hour
	MaxAffinityTTL     = 24 * time.Hour
	// DefaultAffinityThreshold: a bound site keeps its session while a
	// slot is predicted free for it. The reference's 0.8 moved sessions
	// off small sites that were busy but not full, and every move throws
	// the cache away (docs/routing.md, affinity, has the measurement).
	DefaultAffinityThreshold = 1.0
	// DefaultAffinitySessions and DefaultAffinityBytes bound the table: a
	// session costs about 200 bytes with a 36-byte key.
	DefaultAffinitySessions = 100_000
	DefaultAffinityBytes    = 32 << 20
	// DefaultPrefixBytes covers a system prompt and a first message.
	DefaultPrefixBytes = 4096
	// DefaultPrefixExploration is the reference's exploration share.
	DefaultPrefixExploration = 0.02
)

func (c *Gateway) applyDefaults() {
	setString(&c.TrustDomain, DefaultTrustDomain)
	c.TLS.applyDefaults()
	setString(&c.Listen, DefaultGatewayListen)
	setString(&c.Hop.Listen, DefaultHopListen)
	setString(&c.Metrics.Listen, DefaultGatewayMetrics)
	setDuration(&c.PollInterval, DefaultPollInterval)
	setDuration(&c.IdleAfter, DefaultIdleAfter)
	setDuration(&c.ForgetAfter, DefaultForgetAfter)
	setInt(&c.Limits.ClientConns, DefaultClientConns)
	setInt(&c.Limits.HopConns, DefaultHopConns)
	setInt(&c.Limits.HopConnsPerSource, DefaultHopConnsPerSource)
	setDuration(&c.Limits.BodyReadTimeout, DefaultBodyReadTimeout)
	setDuration(&c.Limits.HeaderReadTimeout, DefaultHeaderReadTimeout)
	setDuration(&c.Limits.ClientIdleTimeout, DefaultClientIdleTimeout)
	setDuration(&c.Upstream.ConnectTimeout, DefaultUpstreamConnectTimeout)
	setDuration(&c.Upstream.ResponseHeaderTimeout, DefaultUpstreamResponseHeaderTimeout)
	af := &c.Affinity
	setDuration(&af.TTL, DefaultAffinityTTL)
	setPtr(&af.Threshold, DefaultAffinityThreshold)
	setInt(&af.MaxSessions, DefaultAffinitySessions)
	if af.MaxBytes == 0 {
		af.MaxBytes = DefaultAffinityBytes
	}
	setInt(&af.Prefix.Bytes, DefaultPrefixBytes)
	setPtr(&af.Prefix.Exploration, DefaultPrefixExploration)
	a := &c.Availability
	setPtr(&a.Smoothing, DefaultSmoothing)
	setPtr(&a.CeilingHalfLifeMs, DefaultCeilingHalfLifeMs)
	setPtr(&a.CeilingFloor, DefaultCeilingFloor)
	setPtr(&a.ExploreFloor, DefaultExploreFloor)
	setPtr(&a.FullAfterMs, DefaultFullAfterMs)
	setPtr(&a.RoomAfterMs, DefaultRoomAfterMs)
	setPtr(&a.QueueFull, DefaultQueueFull)
	setString(&a.CeilingModel, CeilingBounds)
	setString(&a.Policy, PolicyAgeAware)
}

// setPtr fills an optional knob whose zero is a meaningful setting (an
// explore floor of 0 is valid), so only absence takes the default.
func setPtr[T any](p **T, def T) {
	if *p == nil {
		*p = &def
	}
}
