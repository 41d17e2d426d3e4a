package sim

import (
	"sort"
	"sync"
	"time"
)

// Bucket bounds of the upstream histograms (docs/sim.md).
var (
	vllmTTFTBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	vllmITLBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	vllmLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// vLLM's token-count histograms use 1-2-5 steps up to max_model_len.
	vllmTokenBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000}

	sglangTTFTBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	sglangITLBuckets  = []float64{0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0}
	sglangE2EBuckets  = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400}

	eppDurationBuckets = []float64{0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600}
	eppTTFTBuckets     = eppDurationBuckets[:24] // the same list truncated at 120
	eppTPOTBuckets     = []float64{0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 2}
)

// histogram is a fixed-bucket histogram: counts per bucket (not cumulative),
// plus the +Inf overflow, sum and count.
type histogram struct {
	bounds []float64
	counts []uint64 // len(bounds)+1; the last is +Inf
	sum    float64
	count  uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v
	h.counts[i]++
	h.sum += v
	h.count++
}

// cumulative returns the count at or below each bound, then the total.
func (h *histogram) cumulative() []uint64 {
	out := make([]uint64, len(h.counts))
	var run uint64
	for i, c := range h.counts {
		run += c
		out[i] = run
	}
	return out
}

func (h *histogram) clone() *histogram {
	c := *h
	c.counts = append([]uint64(nil), h.counts...)
	return &c
}

// engineStats guards the engine-side counters and histograms of vLLM and
// SGLang.
type engineStats struct {
	mu sync.Mutex
	statsData
}

// statsData is a copy of the stats that rendering can read without locks.
type statsData struct {
	promptTokens float64
	genTokens    float64
	finished     map[string]float64 // finished_reason -> count
	requests     float64
	aborted      float64
	ttft         *histogram // vLLM buckets
	itl          *histogram
	e2e          *histogram
	queueTime    *histogram
	promptHist   *histogram
	genHist      *histogram
	sglTTFT      *histogram // SGLang buckets
	sglITL       *histogram
	sglE2E       *histogram
	created      time.Time
}

func newEngineStats() engineStats {
	return engineStats{statsData: statsData{
		finished:   map[string]float64{},
		ttft:       newHistogram(vllmTTFTBuckets),
		itl:        newHistogram(vllmITLBuckets),
		e2e:        newHistogram(vllmLatencyBuckets),
		queueTime:  newHistogram(vllmLatencyBuckets),
		promptHist: newHistogram(vllmTokenBuckets),
		genHist:    newHistogram(vllmTokenBuckets),
		sglTTFT:    newHistogram(sglangTTFTBuckets),
		sglITL:     newHistogram(sglangITLBuckets),
		sglE2E:     newHistogram(sglangE2EBuckets),
	}}
}

func (s *engineStats) observeTTFT(d, queued time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ttft.observe(d.Seconds())
	s.sglTTFT.observe(d.Seconds())
	s.queueTime.observe(queued.Seconds())
}

func (s *engineStats) observeITL(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.itl.observe(d.Seconds())
	s.sglITL.observe(d.Seconds())
}

func (s *engineStats) observeDone(j job, tm timing, e2e time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	s.promptTokens += float64(j.promptTokens)
	s.genTokens += float64(tm.tokens)
	s.finished[j.finishReason]++
	s.e2e.observe(e2e.Seconds())
	s.sglE2E.observe(e2e.Seconds())
	s.promptHist.observe(float64(j.promptTokens))
	s.genHist.observe(float64(tm.tokens))
}

func (s *engineStats) observeAbort(j job, tm timing) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	s.aborted++
	s.finished["abort"]++
	s.genTokens += float64(tm.tokens)
	if tm.tokens > 0 {
		s.promptTokens += float64(j.promptTokens)
	}
}

// snapshot copies the stats for rendering without holding the lock.
func (s *engineStats) snapshot() statsData {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := statsData{
		promptTokens: s.promptTokens, genTokens: s.genTokens, requests: s.requests, aborted: s.aborted,
		finished: map[string]float64{}, created: s.created,
		ttft: s.ttft.clone(), itl: s.itl.clone(), e2e: s.e2e.clone(), queueTime: s.queueTime.clone(),
		promptHist: s.promptHist.clone(), genHist: s.genHist.clone(),
		sglTTFT: s.sglTTFT.clone(), sglITL: s.sglITL.clone(), sglE2E: s.sglE2E.clone(),
	}
	for k, v := range s.finished {
		c.finished[k] = v
	}
	return c
}

// merge adds o's observations into h; both must share bounds.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.sum += o.sum
	h.count += o.count
}
