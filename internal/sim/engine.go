package sim

import (
	"context"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
)

// kvTokensPerSlot sizes an engine's KV cache: an engine with S slots holds
// S × kvTokensPerSlot tokens, so a full batch of average requests fills a
// good part of it and KV usage moves with load as it does on a real engine.
const kvTokensPerSlot = 4096

// Engine is one simulated model server. At most slots requests run at once;
// the rest wait in a FIFO queue. A running request holds its prompt and the
// tokens generated so far in the KV cache. Everything the metrics report is
// read from this state, never invented.
type Engine struct {
	name string
	clk  clock.Clock
	// onFree, when set, is called (without e.mu held) whenever a slot frees
	// so that an EPP holding requests in flow control can dispatch.
	onFree func()

	mu      sync.Mutex
	slots   int
	running int
	queue   []*ticket
	kvUsed  int
	// waitingTokens is the prompt tokens of queued requests (with those
	// admitted and not yet prefilled, SGLang's
	// num_waiting_uncached_tokens; counted whole: a queued prompt's cache
	// hits are known only once it runs).
	waitingTokens int
	stats         engineStats
	gen           rateWindow // generated tokens, for gen_throughput
	// cache is the engine's prefix cache (nil: none); cacheQueries and
	// cacheHits count prompt tokens looked up and found in it.
	cache                   *prefixCache
	cacheQueries, cacheHits int64
	// sharedPrefill: prompts are prefilled one at a time (Options), the
	// next free at prefillFreeAt; set before the engine serves.
	// prefillPerToken is the last prefill's time per token, which turns
	// what is left of that line into the tokens in it.
	sharedPrefill   bool
	prefillFreeAt   time.Time
	prefillPerToken time.Duration
}

type ticket struct {
	granted chan struct{}
	// admitted is set under Engine.mu when the slot is handed over, so a
	// cancelled waiter can tell whether it must give the slot back.
	admitted bool
	tokens   int // prompt tokens, counted in waitingTokens while queued
}

func newEngine(name string, slots int, clk clock.Clock) *Engine {
	return &Engine{name: name, clk: clk, slots: slots, stats: newEngineStats()}
}

// Load is a consistent reading of an engine's state.
type Load struct {
	Running    int
	Waiting    int
	Slots      int
	KVUsed     int
	KVCapacity int
	// WaitingTokens is the prompt tokens of queued requests, and under
	// shared prefill of those admitted and not yet prefilled.
	WaitingTokens int
	// GenThroughput is generated tokens per second over the last few seconds.
	GenThroughput float64
	// CacheQueries and CacheHits are the prompt tokens looked up in the
	// prefix cache and found there, since the engine started.
	CacheQueries, CacheHits int64
}

// CacheHitRate is the prefix cache's hit rate since the start, 0 without
// queries.
func (l Load) CacheHitRate() float64 {
	if l.CacheQueries == 0 {
		return 0
	}
	return float64(l.CacheHits) / float64(l.CacheQueries)
}

// KVUsage is the fraction of the KV cache in use, 0..1.
func (l Load) KVUsage() float64 {
	if l.KVCapacity == 0 {
		return 0
	}
	return min(1, float64(l.KVUsed)/float64(l.KVCapacity))
}

// Load returns the engine's current state.
func (e *Engine) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clk.Now()
	return Load{
		Running:       e.running,
		Waiting:       len(e.queue),
		Slots:         e.slots,
		KVUsed:        e.kvUsed,
		KVCapacity:    e.slots * kvTokensPerSlot,
		WaitingTokens: e.waitingTokens + e.prefillingTokens(now),
		GenThroughput: e.gen.rate(now),
		CacheQueries:  e.cacheQueries,
		CacheHits:     e.cacheHits,
	}
}

// prefill looks a job's prompt up in the prefix cache, caches it, and
// returns its prefill time: ttft plus perToken for each prompt token not
// cached.
func (e *Engine) prefill(j job, ttft, perToken time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	cached := 0
	if e.cache != nil {
		cached = min(e.cache.admit(j.blocks)*prefixBlockTokens, j.promptTokens)
	}
	// Without a cache every prompt is still looked up, and misses, as
	// vLLM counts with prefix caching on and nothing cached.
	e.cacheQueries += int64(j.promptTokens)
	e.cacheHits += int64(cached)
	d := time.Duration(j.promptTokens-cached) * perToken
	if !e.sharedPrefill {
		return ttft + d
	}
	// One prompt at a time: this one starts when those admitted before it
	// are done. A request cancelled meanwhile keeps its turn (the engine
	// prefills what it was given).
	now := e.clk.Now()
	e.prefillFreeAt = later(e.prefillFreeAt, now).Add(d)
	e.prefillPerToken = perToken
	return ttft + e.prefillFreeAt.Sub(now)
}

// prefillingTokens is the prompt tokens admitted and not yet prefilled
// (shared prefill); e.mu is held.
func (e *Engine) prefillingTokens(now time.Time) int {
	if !e.sharedPrefill || e.prefillPerToken <= 0 || !e.prefillFreeAt.After(now) {
		return 0
	}
	return int(e.prefillFreeAt.Sub(now) / e.prefillPerToken)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// setSlots changes capacity; added slots admit waiting requests at once,
// removed ones take effect as running requests finish.
func (e *Engine) setSlots(n int) {
	e.mu.Lock()
	e.slots = n
	e.admitLocked()
	e.mu.Unlock()
	if e.onFree != nil {
		e.onFree()
	}
}

func (e *Engine) admitLocked() {
	for e.running < e.slots && len(e.queue) > 0 {
		t := e.queue[0]
		e.queue[0] = nil
		e.queue = e.queue[1:]
		t.admitted = true
		e.waitingTokens -= t.tokens
		e.running++
		close(t.granted)
	}
}

// tryAcquire takes a free slot without queueing, if there is one.
func (e *Engine) tryAcquire() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running < e.slots && len(e.queue) == 0 {
		e.running++
		return true
	}
	return false
}

// acquire waits for a slot in FIFO order and returns how long it waited.
func (e *Engine) acquire(ctx context.Context, promptTokens int) (time.Duration, error) {
	start := e.clk.Now()
	e.mu.Lock()
	if e.running < e.slots && len(e.queue) == 0 {
		e.running++
		e.mu.Unlock()
		return 0, nil
	}
	t := &ticket{granted: make(chan struct{}), tokens: promptTokens}
	e.queue = append(e.queue, t)
	e.waitingTokens += promptTokens
	e.mu.Unlock()
	select {
	case <-t.granted:
		return e.clk.Now().Sub(start), nil
	case <-ctx.Done():
		e.mu.Lock()
		if t.admitted {
			e.mu.Unlock()
			e.release(0)
			return 0, ctx.Err()
		}
		for i, q := range e.queue {
			if q == t {
				e.queue = append(e.queue[:i], e.queue[i+1:]...)
				e.waitingTokens -= t.tokens
				break
			}
		}
		e.mu.Unlock()
		return 0, ctx.Err()
	}
}

// release frees a slot and the KV tokens the request held.
func (e *Engine) release(kvTokens int) {
	e.mu.Lock()
	e.running--
	e.kvUsed -= kvTokens
	e.admitLocked()
	e.mu.Unlock()
	if e.onFree != nil {
		e.onFree()
	}
}

func (e *Engine) holdKV(n int) {
	e.mu.Lock()
	e.kvUsed += n
	e.mu.Unlock()
}

// job is one completion request as the engine sees it.
type job struct {
	promptTokens int
	outputTokens int
	// finishReason is what the response reports when all tokens are out:
	// "length" when the client capped the output, "stop" otherwise.
	finishReason string
	// hasSlot is set when flow control already took a slot for the job.
	hasSlot bool
	// blocks are the prompt's block hashes, for the prefix cache.
	blocks []uint64
}

// timing reports when a served job reached each phase, for the metrics of
// the layer above (the EPP measures from its own receipt of the request).
type timing struct {
	queued     time.Duration
	firstToken time.Time
	done       time.Time
	tokens     int
}

// serve runs j on the engine: wait for a slot, prefill (ttft, plus perToken
// for each prompt token its prefix cache does not hold), then emit one token
// every tpot. emit is called once per token, in order; an emit error or a
// cancelled ctx aborts the job and frees its slot.
func (e *Engine) serve(ctx context.Context, j job, ttft, perToken, tpot time.Duration, emit func(i int) error) (timing, error) {
	arrived := e.clk.Now()
	var tm timing
	var queued time.Duration
	if !j.hasSlot {
		var err error
		if queued, err = e.acquire(ctx, j.promptTokens); err != nil {
			e.recordAbort(j, tm)
			return tm, err
		}
	}
	tm.queued = queued
	held := j.promptTokens
	e.holdKV(held)
	defer func() { e.release(held) }()

	wait := e.prefill(j, ttft, perToken)
	var last time.Time
	for i := range j.outputTokens {
		if !clock.Sleep(ctx, e.clk, wait) {
			e.recordAbort(j, tm)
			return tm, ctx.Err()
		}
		now := e.clk.Now()
		if i == 0 {
			tm.firstToken = now
			e.stats.observeTTFT(now.Sub(arrived), queued)
		} else {
			e.stats.observeITL(now.Sub(last))
		}
		last = now
		e.holdKV(1)
		held++
		e.tokenOut(now)
		tm.tokens = i + 1
		if err := emit(i); err != nil {
			e.recordAbort(j, tm)
			return tm, err
		}
		wait = tpot
	}
	tm.done = e.clk.Now()
	e.stats.observeDone(j, tm, tm.done.Sub(arrived))
	return tm, nil
}

func (e *Engine) tokenOut(now time.Time) {
	e.mu.Lock()
	e.gen.add(now, 1)
	e.mu.Unlock()
}

func (e *Engine) recordAbort(j job, tm timing) {
	e.stats.observeAbort(j, tm)
}

// rateWindow counts events in one-second buckets over the last few seconds.
type rateWindow struct {
	sec   [8]int64
	count [8]float64
}

const rateSpan = 5 // seconds averaged by rate

func (w *rateWindow) add(now time.Time, n float64) {
	s := now.Unix()
	i := s % int64(len(w.sec))
	if w.sec[i] != s {
		w.sec[i], w.count[i] = s, 0
	}
	w.count[i] += n
}

func (w *rateWindow) rate(now time.Time) float64 {
	s := now.Unix()
	var total float64
	for i := range w.sec {
		if age := s - w.sec[i]; age >= 1 && age <= rateSpan {
			total += w.count[i]
		}
	}
	return total / rateSpan
}
