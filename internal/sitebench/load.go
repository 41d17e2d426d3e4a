package sitebench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// generator sends a workload open loop: each request at its arrival
// instant, whatever the answers to those before it, on a goroutine of its
// own, and records what its client saw.
type generator struct {
	entries []string
	// siteOf names the site behind a sim's address (nginx's X-Upstream),
	// a wide-area link to one included; entrySite the site of each entry
	// point.
	siteOf, entrySite map[string]string
	client            *http.Client
	// retryRefused: a request whose connection is refused is sent again
	// until the entry point listens (the cold start: processes still
	// starting), its latency counted from its arrival.
	retryRefused bool
	// unmeasured: the outcomes are not kept (load that bypasses routers).
	unmeasured bool

	mu   sync.Mutex
	outs []outcome
}

// outcome is one request as its client saw it.
type outcome struct {
	at        time.Duration // its arrival in the workload
	ttft, e2e time.Duration
	// prompt and output are the request's sizes in tokens.
	prompt, output int
	// site served it; entrySite is the site whose entry point took it.
	site, entrySite string
	err             string // "" when it streamed whole
}

// newGenerator sends to entries, the entry points of sites; links names
// the site behind each wide-area link's address.
func newGenerator(entries []string, sites []*site, links map[string]string) *generator {
	g := &generator{entries: entries, siteOf: map[string]string{}, entrySite: map[string]string{}}
	for _, s := range sites {
		g.siteOf[s.sim] = s.name
		for _, e := range s.replicas {
			g.entrySite[e] = s.name
		}
	}
	for addr, name := range links {
		g.siteOf[addr] = name
	}
	g.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0, DisableCompression: true,
		IdleConnTimeout: 30 * time.Second}}
	return g
}

// start sends w from now and returns a channel closed once every request
// has ended.
func (g *generator) start(ctx context.Context, w Workload) <-chan struct{} {
	done := make(chan struct{})
	begin := time.Now()
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		defer wg.Wait()
		for _, r := range w.Requests {
			if d := time.Until(begin.Add(r.At)); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := g.send(ctx, r, begin.Add(r.At))
				if !g.unmeasured {
					g.mu.Lock()
					g.outs = append(g.outs, o)
					g.mu.Unlock()
				}
			}()
		}
	}()
	return done
}

func (g *generator) outcomes() []outcome {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]outcome(nil), g.outs...)
}

// body is a streamed chat completion of r's sizes: the sim reads about four
// bytes of prompt a token.
func body(r Request) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      Model,
		"stream":     true,
		"max_tokens": r.OutputTokens,
		"messages":   []map[string]string{{"role": "user", "content": strings.Repeat("word ", r.PromptTokens*4/5)}},
	})
	return b
}

// send sends one request and reads its stream to the end.
func (g *generator) send(ctx context.Context, r Request, arrived time.Time) outcome {
	o := outcome{at: r.At, entrySite: g.entrySite[g.entries[r.Entry]], prompt: r.PromptTokens, output: r.OutputTokens}
	payload := body(r)
	url := "http://" + g.entries[r.Entry] + "/v1/chat/completions"
	var resp *http.Response
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
		if err != nil {
			o.err = err.Error()
			return o
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err = g.client.Do(req)
		if err == nil {
			break
		}
		if g.retryRefused && errors.Is(err, syscall.ECONNREFUSED) && time.Since(arrived) < time.Minute {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		o.err = "transport: " + err.Error()
		return o
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.err = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.Join(strings.Fields(string(msg)), " "))
		return o
	}
	o.site = resp.Header.Get("X-Grid-Site")
	if up := resp.Header.Get("X-Upstream"); up != "" {
		// nginx names the address it used last (after a retry, the list).
		last := up[strings.LastIndex(up, " ")+1:]
		o.site = g.siteOf[strings.TrimSuffix(last, ",")]
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	whole, errorEvent := false, ""
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		data := bytes.TrimSpace(line[5:])
		if bytes.Equal(data, []byte("[DONE]")) {
			whole = true
			continue
		}
		if code, ok := streamErrorCode(data); ok {
			errorEvent = code
			continue
		}
		if o.ttft == 0 {
			o.ttft = time.Since(arrived)
		}
	}
	o.e2e = time.Since(arrived)
	switch {
	case errorEvent != "":
		o.err = "stream error event: " + errorEvent
	case sc.Err() != nil:
		o.err = "stream: " + sc.Err().Error()
	case !whole:
		o.err = "stream ended without [DONE]"
	}
	return o
}

// streamErrorCode reads an event in the OpenAI error shape ({"error":
// {..., "code": ...}}, the gateway's terminal event, docs/gateway.md) and
// returns its code ("unknown" without one).
func streamErrorCode(data []byte) (string, bool) {
	if !bytes.HasPrefix(data, []byte(`{"error"`)) {
		return "", false
	}
	var ev struct {
		Error *struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &ev) != nil || ev.Error == nil {
		return "", false
	}
	if code, ok := ev.Error.Code.(string); ok && code != "" {
		return code, true
	}
	return "unknown", true
}

// waitRouted waits until every entry point answers a short completion: the
// routers have read what they route on.
func (g *generator) waitRouted(ctx context.Context, model string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i := range g.entries {
		for {
			o := g.send(ctx, Request{Entry: i, PromptTokens: 4, OutputTokens: 1}, time.Now())
			if o.err == "" {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("entry %s does not route %s: %s", g.entries[i], model, o.err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// simControl posts a control change to a sim.
func simControl(addr, change string) error {
	resp, err := http.Post("http://"+addr+"/sim/control", "application/json", strings.NewReader(change))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("sim control %s: status %d", change, resp.StatusCode)
	}
	return nil
}
