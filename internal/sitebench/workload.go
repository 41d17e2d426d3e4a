package sitebench

import (
	"math"
	"math/rand/v2"
	"time"
)

// Workload is the seeded request sequence every router of a cell is sent:
// open-loop arrivals, each with its entry replica and its prompt and output
// lengths. The same seed gives every router the same sequence (common random
// numbers), so routers are compared on the same requests.
type Workload struct {
	Requests []Request
	// MeanService is the mean time one request holds a slot, by the sims'
	// timing: what the arrival rate is set from.
	MeanService time.Duration
}

// Request is one request of a workload.
type Request struct {
	// At is the arrival's offset from the start of load.
	At time.Duration
	// Entry is the index of the gateway replica (or nginx instance) it is
	// sent to, over every site's.
	Entry        int
	PromptTokens int
	OutputTokens int
}

// Sizes are a workload's lognormal request lengths in tokens, each drawn
// length kept within its bounds.
type Sizes struct {
	PromptMedian, PromptSigma float64
	MinPrompt, MaxPrompt      int
	OutputMedian, OutputSigma float64
	MaxOutput                 int
}

// DefaultSizes are the sites benchmark's (docs/operations.md): median
// prompt 400 tokens with σ 1, median output 150 tokens with σ 0.8;
// heavy-tailed, as LLM traffic is. The caps: the sim caps max_tokens at
// 4096, and a 20,000-token prompt is far in the tail already.
var DefaultSizes = Sizes{PromptMedian: 400, PromptSigma: 1, MinPrompt: 1, MaxPrompt: 20_000, OutputMedian: 150, OutputSigma: 0.8, MaxOutput: 2048}

// MixedPromptSizes are the mixed-prompts scenario's: prompts from 100 to
// 30,000 tokens, median 1,000 with σ 1.5 (a tenth above 6,800, a
// hundredth at the cap), the default's outputs.
var MixedPromptSizes = Sizes{PromptMedian: 1000, PromptSigma: 1.5, MinPrompt: 100, MaxPrompt: 30_000, OutputMedian: 150, OutputSigma: 0.8, MaxOutput: 2048}

// Timing is how the sims serve: a request holds its slot for TTFT plus its
// uncached prompt tokens times PrefillPerToken, then one TPOT per output
// token; with SharedPrefill each engine prefills one prompt at a time
// (grid sim --shared-prefill).
type Timing struct {
	TTFT, TPOT, PrefillPerToken time.Duration
	SharedPrefill               bool
	// EPPRefresh is how often each site's EPP recomputes its pool gauges
	// (the sim's --refresh-interval; the real EPP's default is 5 s).
	EPPRefresh time.Duration
}

// service is how long r holds a slot under t.
func (t Timing) service(r Request) time.Duration {
	return t.TTFT + time.Duration(r.PromptTokens)*t.PrefillPerToken + time.Duration(r.OutputTokens)*t.TPOT
}

// Arrivals are how requests arrive.
type Arrivals string

// Arrival processes.
const (
	// Poisson: exponential gaps at the mean rate.
	Poisson Arrivals = "poisson"
	// Bursty: on/off, bursts at 3× the mean rate a third of the time.
	Bursty Arrivals = "bursty"
)

// NewWorkload draws the requests of duration d for slots of capacity at
// load (the arrival rate over the grid's service rate), entering by one of
// entries replicas uniformly, of sizes z.
func NewWorkload(seed uint64, d time.Duration, load float64, slots, entries int, arrivals Arrivals, t Timing, z Sizes) Workload {
	rng := rand.New(rand.NewPCG(seed, 0x5173))
	lognormal := func(median, sigma float64, least, limit int) int {
		return max(least, min(limit, int(median*math.Exp(sigma*rng.NormFloat64()))))
	}
	prompt := func() int { return lognormal(z.PromptMedian, z.PromptSigma, z.MinPrompt, z.MaxPrompt) }
	output := func() int { return lognormal(z.OutputMedian, z.OutputSigma, 1, z.MaxOutput) }
	// The mean service time of this workload's sizes, from a large sample
	// of the same distributions: the rate is set so that load is exact
	// (shared prefill's waits for the prefills ahead aside).
	var sum time.Duration
	const sample = 20_000
	for range sample {
		sum += t.service(Request{PromptTokens: prompt(), OutputTokens: output()})
	}
	mean := sum / sample
	rate := load * float64(slots) / mean.Seconds() // requests per second
	w := Workload{MeanService: mean}
	var at float64
	period := 60 / rate // an on/off cycle holds about 60 requests
	for {
		r := rate
		if arrivals == Bursty {
			r = 3 * rate // in the on third of each period
		}
		at += rng.ExpFloat64() / r
		if phase := math.Mod(at, period); arrivals == Bursty && phase >= period/3 {
			at += period - phase // off: the next arrival is drawn from the next on
			continue
		}
		if at >= d.Seconds() {
			break
		}
		w.Requests = append(w.Requests, Request{
			At:           time.Duration(at * float64(time.Second)),
			Entry:        rng.IntN(entries),
			PromptTokens: prompt(),
			OutputTokens: output(),
		})
	}
	return w
}
