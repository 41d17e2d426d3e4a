package sitebench

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

// modelTiming is the benchmark's timing at 20 ms a token, prompts
// prefilled one at a time: 20 ms to a first token, 50 µs a prompt token.
var modelTiming = Timing{TTFT: 20 * time.Millisecond, TPOT: 20 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond, SharedPrefill: true}

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// A worked example, by hand: a 20,000-token prompt (a second of prefill)
// at site s0, then two short ones. nginx-wrr and jsq send the third behind
// the long prompt's prefill; a router that sees the engines sends it to
// the idle site.
func TestModelledRoutersWorkedExample(t *testing.T) {
	sites := []*site{{name: "s0", slots: 8, endpoints: 1, perEngine: 8}, {name: "s1", slots: 8, endpoints: 1, perEngine: 8}}
	w := Workload{Requests: []Request{
		{At: 0, PromptTokens: 20_000, OutputTokens: 1},
		{At: ms(10), PromptTokens: 100, OutputTokens: 100},
		{At: ms(20), PromptTokens: 100, OutputTokens: 1},
	}}
	for _, tc := range []struct {
		rule ModelRule
		// ttft of each request, and the site of the third
		ttft  [3]time.Duration
		third string
	}{
		// r0: 1 s prefill + 20 ms. r1 at s1 alone: 5 ms + 20. r2 at s0
		// waits for r0's prefill (free at 1,000 ms), then 5 ms + 20.
		{ModelWRR, [3]time.Duration{ms(1020), ms(25), ms(1005)}, "s0"},
		{ModelJSQ, [3]time.Duration{ms(1020), ms(25), ms(1005)}, "s0"},
		// r2 at s1 behind r1's prefill, free at 15 ms: at once, 5 + 20.
		{ModelSiteOracle, [3]time.Duration{ms(1020), ms(25), ms(25)}, "s1"},
		{ModelOneLine, [3]time.Duration{ms(1020), ms(25), ms(25)}, "s1"},
	} {
		outs, err := replay(w, sites, 1, modelTiming, tc.rule, siteEvents{})
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range outs {
			if o.ttft != tc.ttft[i] {
				t.Errorf("%s: request %d's first token after %v, want %v", tc.rule, i, o.ttft, tc.ttft[i])
			}
		}
		if outs[2].site != tc.third {
			t.Errorf("%s: the third request served by %s, want %s", tc.rule, outs[2].site, tc.third)
		}
		if want := outs[1].ttft + 99*modelTiming.TPOT; outs[1].e2e != want {
			t.Errorf("%s: 100 tokens end after %v, want %v", tc.rule, outs[1].e2e, want)
		}
	}
}

// An engine with every slot taken queues a request until one frees, and
// the site oracle reads that wait: two sites of one slot, the first held
// by a long answer, the second by a shorter one.
func TestModelledQueueWaitsForASlot(t *testing.T) {
	sites := []*site{{name: "s0", slots: 1, endpoints: 1, perEngine: 1}, {name: "s1", slots: 1, endpoints: 1, perEngine: 1}}
	w := Workload{Requests: []Request{
		{At: 0, PromptTokens: 100, OutputTokens: 50},     // s0 until 25 + 49 × 20 = 1,005 ms
		{At: ms(1), PromptTokens: 100, OutputTokens: 10}, // s1 until 1 + 25 + 9 × 20 = 206 ms
		{At: ms(2), PromptTokens: 100, OutputTokens: 1},
	}}
	outs, err := replay(w, sites, 1, modelTiming, ModelSiteOracle, siteEvents{})
	if err != nil {
		t.Fatal(err)
	}
	// Sent to s1, admitted at 206 ms: its first token 25 ms later.
	if got, want := outs[2].ttft, ms(206+25-2); got != want || outs[2].site != "s1" {
		t.Errorf("the third request: first token after %v at %s, want %v at s1", got, outs[2].site, want)
	}
	outs, err = replay(w, sites, 1, modelTiming, ModelOneLine, siteEvents{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := outs[2].ttft, ms(206+25-2); got != want || outs[2].site != "s1" {
		t.Errorf("one line: the third request's first token after %v at %s, want %v at s1", got, outs[2].site, want)
	}
}

// The modelled nginx-wrr is nginx's smooth weighted round robin per
// instance: over a long workload every site takes its share of the slots.
func TestModelledWRRWeighsBySlots(t *testing.T) {
	sites := []*site{{name: "s0", slots: 8, endpoints: 1, perEngine: 8}, {name: "s1", slots: 16, endpoints: 2, perEngine: 8}, {name: "s2", slots: 32, endpoints: 4, perEngine: 8}}
	w := NewWorkload(3, 10*time.Minute, 0.8, 56, 6, Poisson, modelTiming, MixedPromptSizes)
	outs, err := replay(w, sites, 2, modelTiming, ModelWRR, siteEvents{})
	if err != nil {
		t.Fatal(err)
	}
	res := summarise(MixedPrompts, "model:nginx-wrr", 0, outs, 0)
	for name, want := range map[string]float64{"s0": 8.0 / 56, "s1": 16.0 / 56, "s2": 32.0 / 56} {
		if got := res.Share[name]; math.Abs(got-want) > 0.005 {
			t.Errorf("%s took %.3f of the requests, want %.3f", name, got, want)
		}
	}
}

// A modelled router runs only where nothing happens to the sites, and
// says so before anything starts.
func TestModelledRouterRefusesEvents(t *testing.T) {
	cfg := Config{Slots: []int{8, 16}, Replicas: 1, Load: 0.5, Duration: time.Second, Runs: 1, Timing: DefaultTiming,
		Routers: []Router{{Name: "model:jsq", Model: ModelJSQ}}, Scenarios: []Scenario{RestartAll}}
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "restart") || !strings.Contains(err.Error(), "model:jsq") {
		t.Fatalf("Run = %v, want an error naming the router and the scenario", err)
	}
	cfg.Scenarios = []Scenario{Steady}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("a modelled steady cell needs no process: %v", err)
	}
	if len(res) != 1 || res[0].Requests == 0 || res[0].CPUBusy != -1 {
		t.Fatalf("Run = %+v, want one modelled cell with requests", res)
	}
}

// Requests that bypass the router hold a site's slots in the model as on
// the processes: jsq, which counts them, sends around them; nginx-wrr,
// which does not, queues behind them. Neither is measured.
func TestModelledExternalLoadIsCountedNotMeasured(t *testing.T) {
	sites := []*site{{name: "s0", slots: 1, endpoints: 1, perEngine: 1}, {name: "s1", slots: 2, endpoints: 1, perEngine: 2}}
	w := Workload{Requests: []Request{{At: ms(10), PromptTokens: 100, OutputTokens: 1}}}
	ev := siteEvents{site: 1, external: []Request{
		{At: 0, PromptTokens: 100, OutputTokens: 50}, // until 25 + 49 × 20 = 1,005 ms
		{At: ms(1), PromptTokens: 100, OutputTokens: 50},
	}}
	for _, tc := range []struct {
		rule ModelRule
		site string
		ttft time.Duration
	}{
		{ModelJSQ, "s0", ms(25)},
		// nginx-wrr's first pick at weights 1:2 is s1, whose slots free
		// at 1,005 ms.
		{ModelWRR, "s1", ms(1005 + 25 - 10)},
	} {
		outs, err := replay(w, sites, 1, modelTiming, tc.rule, ev)
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) != 1 {
			t.Fatalf("%s: %d outcomes, want the router's one request", tc.rule, len(outs))
		}
		if outs[0].site != tc.site || outs[0].ttft != tc.ttft {
			t.Errorf("%s: served by %s after %v, want %s after %v", tc.rule, outs[0].site, outs[0].ttft, tc.site, tc.ttft)
		}
	}
}

// A site that loses engines keeps serving what they hold and sends nothing
// new to them; once they are back, they take requests again.
func TestModelledCapacityDrop(t *testing.T) {
	sites := []*site{{name: "s0", slots: 2, endpoints: 2, perEngine: 1}}
	w := Workload{Requests: []Request{
		{At: 0, PromptTokens: 100, OutputTokens: 10},     // engine 0 until 25 + 9 × 20 = 205 ms
		{At: ms(10), PromptTokens: 100, OutputTokens: 1}, // one engine left: behind the first
		{At: ms(250), PromptTokens: 100, OutputTokens: 10},
		{At: ms(260), PromptTokens: 100, OutputTokens: 1}, // both back: the empty one
	}}
	ev := siteEvents{site: 0, dropAt: ms(5), backAt: ms(240), dropTo: 1}
	outs, err := replay(w, sites, 1, modelTiming, ModelJSQ, ev)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{ms(25), ms(205 + 25 - 10), ms(25), ms(25)}
	for i, o := range outs {
		if o.ttft != want[i] {
			t.Errorf("request %d: first token after %v, want %v", i, o.ttft, want[i])
		}
	}
}
