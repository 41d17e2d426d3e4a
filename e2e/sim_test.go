package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

const simModel = "Qwen/Qwen3-8B"

// startSim runs one llm-d-inference-sim: slots concurrent requests
// (--max-num-seqs), a 10 ms time to first token and tokenMs per further
// token. --log-http logs every request's URI, which the /v1/loads probe
// count is read from.
func startSim(t *testing.T, slots, tokenMs int) (url string, p *process) {
	t.Helper()
	port := freePort(t)
	p = run(t, binary(t, simPart), nil, "--port", fmt.Sprint(port), "--model", simModel, "--mode", "random",
		"--max-num-seqs", fmt.Sprint(slots), "--time-to-first-token", "10ms", "--inter-token-latency", fmt.Sprintf("%dms", tokenMs), "--log-http")
	url = "http://" + addr(port)
	eventually(t, "the simulator answers /v1/models", 60*time.Second, func() bool { return strings.Contains(get(url+"/v1/models"), simModel) })
	return url, p
}

// answer is what a client saw of one chat completion.
type answer struct {
	status           int
	site, retryAfter string
	chunks           int
	done, errorEvent bool
	transportErr     error
}

// chat sends one chat completion to base (a gateway or an engine) and reads
// the whole answer. tokens is max_tokens, generated to the end (ignore_eos).
func chat(ctx context.Context, base string, tokens int, stream bool) answer {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there"}],"max_tokens":%d,"ignore_eos":true,"stream":%v}`, simModel, tokens, stream)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{transportErr: err}
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, site: resp.Header.Get("X-Grid-Site"), retryAfter: resp.Header.Get("Retry-After")}
	if !stream {
		io.Copy(io.Discard, resp.Body)
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			a.done = true
		case strings.HasPrefix(line, `data: {"error"`):
			a.errorEvent = true
		case strings.HasPrefix(line, "data: "):
			a.chunks++
		}
	}
	if err := sc.Err(); err != nil {
		a.transportErr = err
	}
	return a
}

// hold sends n streamed completions of tokens tokens to base at once and
// returns a wait for their end. The simulator finishes a request whose
// client went away, so a test frees its slots by waiting, not by hanging
// up.
func hold(base string, n, tokens int) (wait func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { chat(context.Background(), base, tokens, true) })
	}
	return wg.Wait
}

// providerGauge reads one grid_provider_* gauge of provider from an
// operator's /metrics.
func providerGauge(s *site, name, provider string) (float64, bool) {
	return metric(s.operatorMetrics(), name, `grid_provider="`+provider+`"`)
}

// TestRealVLLMSimulator runs one site's operator and gateway in front of a
// real llm-d-inference-sim, read as kind vllm and as kind auto: the
// provider turns ready, its running requests are read as in-flight, the
// absent /v1/loads is asked once and remembered, and a streamed answer
// crosses the gateway whole.
func TestRealVLLMSimulator(t *testing.T) {
	for _, kind := range []string{"vllm", "auto"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			gridCerts(t, dir+"/certs", "east")
			url, sim := startSim(t, 4, 20)
			east := newSite(t, "east", provider{name: "sim", model: simModel, kind: kind, upstream: url, metrics: url})
			east.start(t, dir)

			eventually(t, "the provider is read ready with one endpoint", 20*time.Second, func() bool {
				r, _ := providerGauge(east, "grid_provider_ready", "sim")
				n, _ := providerGauge(east, "grid_provider_ready_endpoints", "sim")
				return r == 1 && n == 1
			})
			eventually(t, "the gateway routes the model", 20*time.Second, func() bool {
				return chat(context.Background(), "http://"+addr(east.client), 2, false).status == http.StatusOK
			})

			// Three answers of 200 tokens at 20 ms hold the engine for 4 s.
			release := hold("http://"+addr(east.client), 3, 200)
			eventually(t, "three requests in flight", 10*time.Second, func() bool {
				v, _ := providerGauge(east, "grid_provider_in_flight_requests", "sim")
				return v == 3
			})
			release()
			eventually(t, "nothing in flight", 10*time.Second, func() bool {
				v, ok := providerGauge(east, "grid_provider_in_flight_requests", "sim")
				return ok && v == 0
			})

			a := chat(context.Background(), "http://"+addr(east.client), 16, true)
			if a.status != http.StatusOK || !a.done || a.errorEvent || a.chunks < 16 || a.site != "east" || a.transportErr != nil {
				t.Errorf("a streamed answer through the gateway: %+v, want 200 from east, at least 16 chunks, then [DONE]", a)
			}

			// The simulator serves no /v1/loads. A 404 is remembered once
			// the provider was judged ready (docs/operator.md), so it is
			// asked at most twice (before and after the first verdict), and
			// never again over the next 20 scrapes.
			scrapes := func() float64 {
				v, _ := metric(east.operatorMetrics(), "grid_provider_scrape_total", `grid_provider="sim"`, `result="success"`)
				return v
			}
			asked := func() int { return strings.Count(sim.output(), `requestURI="/v1/loads?`) }
			eventually(t, "20 successful scrapes", 20*time.Second, func() bool { return scrapes() >= 20 })
			before, at := asked(), scrapes()
			eventually(t, "20 more scrapes", 20*time.Second, func() bool { return scrapes() >= at+20 })
			if after := asked(); before < 1 || before > 2 || after != before {
				t.Errorf("the simulator was asked for /v1/loads %d times in its first 20 scrapes and %d in the next 20, want 1 or 2, then none", before, after-before)
			}
		})
	}
}

// TestRealVLLMSimulatorTwoSites runs two sites, each an operator and a
// gateway in front of one llm-d-inference-sim of two slots, and calls east's
// gateway as a client would: with east's engine filled from outside, east's
// requests are served by west; with both filled, east sheds with 429 and a
// Retry-After, and routes again once they drain; with west's engine killed,
// no client of east sees an error.
func TestRealVLLMSimulatorTwoSites(t *testing.T) {
	dir := t.TempDir()
	gridCerts(t, dir+"/certs", "east", "west")
	eastSim, _ := startSim(t, 2, 20)
	westSim, westProc := startSim(t, 2, 20)
	east := newSite(t, "east", provider{name: "east-sim", model: simModel, kind: "vllm", upstream: eastSim, metrics: eastSim})
	west := newSite(t, "west", provider{name: "west-sim", model: simModel, kind: "vllm", upstream: westSim, metrics: westSim})
	east.peers, west.peers = []*site{west}, []*site{east}
	east.shedding = true
	east.start(t, dir)
	west.start(t, dir)
	gateway := "http://" + addr(east.client)
	// Answers of 2 s, four at a time, until both sites served some: the
	// gateway learns each site's pace from answers as long as the ones
	// that fill the engines below (read at the pace of 1-token answers, a
	// queue of 3 s answers looks drained within a poll: docs/routing.md).
	eventually(t, "east's gateway serves from both sites", 60*time.Second, func() bool {
		var mu sync.Mutex
		seen := map[string]bool{}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				a := chat(context.Background(), gateway, 100, true)
				mu.Lock()
				seen[a.site] = true
				mu.Unlock()
			})
		}
		wg.Wait()
		return seen["east"] && seen["west"]
	})

	t.Run("a filled engine is routed around", func(t *testing.T) {
		// Four answers of 3 s on east's two slots: two run, two wait.
		defer hold(eastSim, 4, 150)()
		eventually(t, "east's gateway reads east's engine with a queue", 10*time.Second, func() bool {
			c, ok := east.candidate("east-sim")
			return ok && c.Queue >= 2 && c.InFlight >= 4
		})
		served := map[string]int{}
		for range 10 {
			a := chat(context.Background(), gateway, 4, true)
			if a.status != http.StatusOK || !a.done {
				t.Fatalf("an answer while east is filled: %+v", a)
			}
			served[a.site]++
		}
		if served["west"] < 9 {
			t.Errorf("with east's engine filled, east's gateway served %v; want at least 9 of 10 from west", served)
		}
	})

	t.Run("both filled: 429 with Retry-After, then routes again", func(t *testing.T) {
		// Four answers of 5 s on each engine's two slots.
		waitEast, waitWest := hold(eastSim, 4, 250), hold(westSim, 4, 250)
		var shed answer
		defer func() {
			if t.Failed() {
				t.Logf("east's snapshot: %s", get("http://"+addr(east.gwMetrics)+"/api/snapshot"))
			}
		}()
		eventually(t, "east's gateway sheds", 15*time.Second, func() bool {
			// A probe that is routed waits behind the engines' queues.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			shed = chat(ctx, gateway, 1, false)
			return shed.status == http.StatusTooManyRequests
		})
		if shed.retryAfter == "" {
			t.Errorf("a shed answer without Retry-After: %+v", shed)
		}
		waitEast()
		waitWest()
		eventually(t, "east's gateway routes again once the engines drained", 20*time.Second, func() bool {
			return chat(context.Background(), gateway, 1, false).status == http.StatusOK
		})
	})

	t.Run("a killed engine: what it held fails visibly, nothing else fails", func(t *testing.T) {
		// Clients call east's gateway without pause while west's engine is
		// killed. What west held cannot be finished: a stream must end
		// with the terminal error event, never look complete, and a
		// request still waiting for its headers gets an error status. So
		// may a request sent in the moment before the grid reads the
		// engine down (on a pooled connection to the dead engine; a POST
		// that may have reached it is not sent again, as nginx's default
		// does not resend one). Every request begun a second after east's
		// gateway read west not ready must be served whole.
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		var killed, settled time.Time
		var answers, interrupted int
		var broken []answer
		var wg sync.WaitGroup
		// Two clients: what east's two slots serve alone once west is
		// gone, so that east does not shed (the shedding subtest above).
		for range 2 {
			wg.Go(func() {
				for ctx.Err() == nil {
					began := time.Now()
					a := chat(context.Background(), gateway, 8, true)
					mu.Lock()
					answers++
					whole := a.status == http.StatusOK && a.done && !a.errorEvent && a.transportErr == nil
					honest := a.transportErr == nil && (a.status != http.StatusOK || a.errorEvent)
					switch {
					case whole:
					case honest && !killed.IsZero() && (settled.IsZero() || began.Before(settled)):
						interrupted++ // on west, or sent to it, as it died
					default:
						broken = append(broken, a)
					}
					mu.Unlock()
				}
			})
		}
		time.Sleep(time.Second)
		mu.Lock()
		killed = time.Now()
		mu.Unlock()
		westProc.kill()
		eventually(t, "east's gateway reads west's engine not ready", 30*time.Second, func() bool {
			ready, found := east.seesReady("west-sim")
			return found && !ready
		})
		mu.Lock()
		notReady := time.Since(killed)
		settled = time.Now().Add(time.Second)
		mu.Unlock()
		time.Sleep(2 * time.Second)
		cancel()
		wg.Wait()
		if len(broken) > 0 {
			t.Errorf("%d of %d answers at east's gateway were broken across the kill of west's engine; the first: %+v", len(broken), answers, broken[0])
		}
		if interrupted > 4 {
			t.Errorf("%d requests failed as west died; at most a few of the 2 clients' can have been on it", interrupted)
		}
		t.Logf("%d answers across the kill: %d on west as it died ended with an error the client sees, none broken; west read not ready after %v",
			answers, interrupted, notReady.Round(100*time.Millisecond))
	})
}
