// Package sim is a simulated inference backend that speaks the real formats:
// an llm-d EPP in front of N engines, a vLLM server or an SGLang server. Each
// engine runs a queueing model (at most --slots requests at once, the rest in
// a FIFO queue, prefill then one token per TPOT), and the metrics, /v1/loads
// and latencies are read from that model, never from constants. A control
// endpoint lets tests and the demo break it on purpose.
package sim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grid-inference/grid/internal/clock"
)

// Kinds of backend the sim can be.
const (
	KindEPP    = "epp"
	KindVLLM   = "vllm"
	KindSGLang = "sglang"
)

// Options configure a Sim. Zero values take the defaults of `grid sim`.
type Options struct {
	Kind  string
	Model string
	// Pool is the EPP pool name (label `name`); default "<model-ish>-pool".
	Pool string
	// Endpoints is the number of engines: EPP endpoints, or data-parallel
	// engines behind one vLLM/SGLang API server.
	Endpoints int
	// Slots is how many requests one engine runs at once.
	Slots int
	// TTFT is the prefill time of a request once it has a slot.
	TTFT time.Duration
	// TPOT is the time per output token after the first.
	TPOT time.Duration
	// PrefillPerToken is the prefill time of each prompt token the
	// engine's prefix cache does not hold, on top of TTFT; 0 makes
	// prefill TTFT whatever the prompt.
	PrefillPerToken time.Duration
	// SharedPrefill makes an engine prefill one prompt at a time, in the
	// order its requests got their slots, as an engine's compute is one:
	// a prompt waits for those admitted before it to be prefilled. Off,
	// each running request prefills on its own.
	SharedPrefill bool
	// PrefixCacheTokens sizes each engine's prefix cache (least recently
	// used blocks of 16 tokens evicted); 0 is no cache.
	PrefixCacheTokens int
	// LegacyLoads makes SGLang answer /v1/loads in the pre-May-2026 shape.
	LegacyLoads bool
	// MetricsToken, when set, is required as a bearer token on /metrics.
	MetricsToken string
	// FlowControl makes the EPP hold requests in its own queue while no
	// endpoint has a free slot, and export the flow-control series.
	FlowControl bool
	// RefreshInterval is how often the EPP recomputes its pool gauges. The
	// real EPP's default is 5s; the sim defaults to 1s so tests stay quick.
	RefreshInterval time.Duration
	Clock           clock.Clock
	Logger          *slog.Logger
}

// DefaultModel is the model a sim serves unless told otherwise.
const DefaultModel = "Qwen/Qwen3-8B"

var nonLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// DefaultPool derives an EPP pool name from a model name:
// "Qwen/Qwen3-8B" becomes "qwen3-8b-pool".
func DefaultPool(model string) string {
	base := strings.ToLower(model[strings.LastIndexByte(model, '/')+1:])
	base = strings.Trim(nonLabel.ReplaceAllString(base, "-"), "-")
	if base == "" {
		base = "model"
	}
	return base + "-pool"
}

func (o *Options) setDefaults() error {
	if o.Kind == "" {
		o.Kind = KindEPP
	}
	switch o.Kind {
	case KindEPP, KindVLLM, KindSGLang:
	default:
		return fmt.Errorf("sim kind %q: want epp, vllm or sglang", o.Kind)
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.Pool == "" {
		o.Pool = DefaultPool(o.Model)
	}
	if o.Endpoints == 0 {
		o.Endpoints = 1
	}
	if o.Slots == 0 {
		o.Slots = 8
	}
	if o.TTFT == 0 {
		o.TTFT = 50 * time.Millisecond
	}
	if o.TPOT == 0 {
		o.TPOT = 10 * time.Millisecond
	}
	if o.RefreshInterval == 0 {
		o.RefreshInterval = time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.Endpoints < 1:
		return fmt.Errorf("endpoints must be at least 1, got %d", o.Endpoints)
	case o.Slots < 1:
		return fmt.Errorf("slots must be at least 1, got %d", o.Slots)
	case o.TTFT < 0 || o.TPOT < 0:
		return errors.New("ttft and tpot must not be negative")
	case o.RefreshInterval < 0:
		return errors.New("refresh interval must be positive")
	}
	return nil
}

// Sim is one simulated backend. Serve its Handler and call Run for the
// background work (the EPP's pool-gauge refresh).
type Sim struct {
	opts  Options
	clk   clock.Clock
	log   *slog.Logger
	start time.Time
	stop  chan struct{} // closed when Run returns: hung handlers let go

	mu      sync.Mutex
	engines []*Engine
	held    []*heldRequest // flow-control queue (EPP with FlowControl)
	control control

	hits     sync.Map // route -> *atomic.Int64
	epp      *eppMetrics
	rngMu    sync.Mutex
	rng      *rand.Rand
	stopOnce sync.Once
	nextID   atomic.Int64
}

// heldRequest is a request the EPP's flow control holds before dispatch.
// When it is dispatched, the engine's slot is already taken for it.
type heldRequest struct {
	ready chan *Engine
	fair  string
}

// New builds a sim from opts.
func New(opts Options) (*Sim, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &Sim{
		opts:  opts,
		clk:   opts.Clock,
		log:   opts.Logger,
		start: opts.Clock.Now(),
		stop:  make(chan struct{}),
		rng:   rand.New(rand.NewPCG(uint64(opts.Clock.Now().UnixNano()), 0x5eed)),
	}
	s.control.Slots = opts.Slots
	s.control.Endpoints = opts.Endpoints
	for i := range opts.Endpoints {
		s.engines = append(s.engines, s.newEngine(i))
	}
	if opts.Kind == KindEPP {
		s.epp = newEPPMetrics(s)
		s.epp.refresh()
	}
	return s, nil
}

func (s *Sim) newEngine(i int) *Engine {
	e := newEngine(s.engineName(i), s.control.Slots, s.clk)
	e.cache = newPrefixCache(s.opts.PrefixCacheTokens)
	e.sharedPrefill = s.opts.SharedPrefill
	e.stats.created = s.clk.Now()
	e.onFree = s.dispatchHeld
	return e
}

// engineName names engine i the way each backend labels it: an EPP endpoint
// is "<pod>-rank-0"; a vLLM engine or SGLang DP rank is its index.
func (s *Sim) engineName(i int) string {
	if s.opts.Kind != KindEPP {
		return fmt.Sprint(i)
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", s.opts.Pool, i)
	sum := h.Sum64()
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	suffix := make([]byte, 5)
	for j := range suffix {
		suffix[j] = alphabet[sum%uint64(len(alphabet))]
		sum /= uint64(len(alphabet))
	}
	base := strings.TrimSuffix(s.opts.Pool, "-pool")
	return fmt.Sprintf("%s-decode-%08x-%s-rank-0", base, uint32(sum), suffix)
}

// Run does the sim's background work until ctx ends.
func (s *Sim) Run(ctx context.Context) {
	defer s.stopOnce.Do(func() { close(s.stop) })
	if s.epp == nil {
		<-ctx.Done()
		return
	}
	t := s.clk.NewTicker(s.opts.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.epp.refresh()
		}
	}
}

// Engines returns the current engines, in endpoint order.
func (s *Sim) Engines() []*Engine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Engine(nil), s.engines...)
}

// pick chooses the engine for a new request: the one with the least work
// (queue first, then running), like an EPP's queue scorer or a DP balancer.
// With flow control on, it returns nil while no engine has a free slot.
func (s *Sim) pickLocked() *Engine {
	var best *Engine
	var bestLoad Load
	for _, e := range s.engines {
		l := e.Load()
		if best == nil || l.Waiting < bestLoad.Waiting ||
			(l.Waiting == bestLoad.Waiting && l.Running*bestLoad.Slots < bestLoad.Running*l.Slots) {
			best, bestLoad = e, l
		}
	}
	if best != nil && s.epp != nil && s.opts.FlowControl && bestLoad.Running+bestLoad.Waiting >= bestLoad.Slots {
		return nil
	}
	return best
}

// route returns the engine a request runs on, waiting in the EPP's flow
// control queue when it is on and every endpoint is busy. hasSlot reports
// that flow control already took the engine slot for the request.
func (s *Sim) route(ctx context.Context, fair string) (e *Engine, hasSlot bool, err error) {
	s.mu.Lock()
	if len(s.engines) == 0 {
		s.mu.Unlock()
		return nil, false, errNoEndpoints
	}
	if len(s.held) == 0 {
		if e := s.pickLocked(); e != nil {
			s.mu.Unlock()
			return e, false, nil
		}
	}
	h := &heldRequest{ready: make(chan *Engine, 1), fair: fair}
	s.held = append(s.held, h)
	s.mu.Unlock()
	s.epp.flowQueueChanged(fair, 1)
	select {
	case e := <-h.ready:
		return e, true, nil
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case e := <-h.ready: // dispatched as we gave up: the slot is ours to free
			s.mu.Unlock()
			return e, true, nil
		default:
		}
		for i, x := range s.held {
			if x == h {
				s.held = append(s.held[:i], s.held[i+1:]...)
				break
			}
		}
		s.mu.Unlock()
		s.epp.flowQueueChanged(fair, -1)
		return nil, false, ctx.Err()
	}
}

var errNoEndpoints = errors.New("no endpoints in the pool")

// dispatchHeld hands held requests to engines that have room, in order.
func (s *Sim) dispatchHeld() {
	for {
		s.mu.Lock()
		if len(s.held) == 0 {
			s.mu.Unlock()
			return
		}
		e := s.pickLocked()
		if e == nil || !e.tryAcquire() {
			s.mu.Unlock()
			return
		}
		h := s.held[0]
		s.held = s.held[1:]
		h.ready <- e
		s.mu.Unlock()
		s.epp.flowQueueChanged(h.fair, -1)
	}
}

func (s *Sim) hit(route string) {
	v, _ := s.hits.LoadOrStore(route, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (s *Sim) hitCounts() map[string]int64 {
	out := map[string]int64{}
	s.hits.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

func (s *Sim) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64() < p
}

// Handler serves the backend's routes.
func (s *Sim) Handler() http.Handler {
	mux := http.NewServeMux()
	count := func(route string, h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			s.hit(route)
			if route != "/sim/control" && s.state().Down {
				writeOpenAIError(w, http.StatusServiceUnavailable, "service unavailable", "ServiceUnavailableError")
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("POST /v1/chat/completions", count("/v1/chat/completions", s.handleCompletion(chatAPI)))
	mux.HandleFunc("POST /v1/completions", count("/v1/completions", s.handleCompletion(completionAPI)))
	mux.HandleFunc("POST /v1/embeddings", count("/v1/embeddings", s.handleEmbeddings))
	mux.HandleFunc("GET /v1/models", count("/v1/models", s.handleModels))
	mux.HandleFunc("GET /metrics", count("/metrics", s.handleMetrics))
	mux.HandleFunc("GET /health", count("/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	if s.opts.Kind == KindSGLang {
		mux.HandleFunc("GET /v1/loads", count("/v1/loads", s.handleLoads))
	} else {
		// Count probes of a route this backend does not have, so tests can
		// see how often a scraper asked.
		mux.HandleFunc("GET /v1/loads", count("/v1/loads", http.NotFound))
	}
	mux.HandleFunc("GET /sim/control", count("/sim/control", s.handleControlGet))
	mux.HandleFunc("POST /sim/control", count("/sim/control", s.handleControlPost))
	return mux
}
