package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDrainPastItsDeadline: SIGTERM to a gateway with 20 streams open that
// outlast its one-second drain: streams it detached (limits.detachAfter
// 0s), streams it would detach but copies still (limits.detachAfter
// longer than they run), and streams it copies (limits.detachStreams
// off). Each client reads what it got, then the
// terminal error event naming the shutdown, then a well-framed end: no
// stream looks complete without its [DONE], none breaks mid-chunk. The
// gateway exits 0 within its drain and the grace of the event.
func TestDrainPastItsDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	// 2,000 tokens at 10 ms: 20 s per answer.
	dir, certs, signals := startEastEngine(t, "--slots", "32")
	for i, limits := range []string{"{detachAfter: 0s}", "{detachAfter: 1h}", "{detachStreams: false}"} {
		t.Run("limits="+limits, func(t *testing.T) {
			client := freePort(t)
			gw := fmt.Sprintf("site: east\ntls: {ca: %[1]s/ca.crt, cert: %[1]s/east.crt, key: %[1]s/east.key}\nlisten: %[2]q\nhop: {listen: %[3]q}\nmetrics: {listen: %[4]q}\noperator: {signals: \"https://%[5]s\"}\npollInterval: 250ms\nlimits: %[6]s\n",
				certs, client, freePort(t), freePort(t), signals, limits)
			gwFile := filepath.Join(dir, fmt.Sprintf("gateway-%d.yaml", i))
			os.WriteFile(gwFile, []byte(gw), 0o600)
			gateway := start(t, "gateway", "--config", gwFile, "--drain-timeout", "1s")
			drainPastDeadline(t, client, gateway)
		})
	}
}

// startEastEngine runs site east's vLLM sim (with simArgs) and operator,
// and returns the test's directory, east's certificates and the
// operator's signals address, for the gateways a test starts.
func startEastEngine(t *testing.T, simArgs ...string) (dir, certs, signals string) {
	t.Helper()
	dir = t.TempDir()
	certs = filepath.Join(dir, "certs")
	gridCerts(t, certs, "east")
	engine := freePort(t)
	signals = freePort(t)
	start(t, append([]string{"sim", "--kind", "vllm", "--listen", engine}, simArgs...)...)
	op := fmt.Sprintf("site: east\ntls: {ca: %[1]s/ca.crt, cert: %[1]s/east.crt, key: %[1]s/east.key}\nsignals: {listen: %[2]q}\nmetrics: {listen: %[3]q}\nstateDir: %[4]s\nscrapeInterval: 200ms\nproviders:\n  - {name: engine, model: Qwen/Qwen3-8B, kind: vllm, upstream: \"http://%[5]s\", metrics: {endpoint: \"http://%[5]s\"}}\n",
		certs, signals, freePort(t), filepath.Join(dir, "state"), engine)
	opFile := filepath.Join(dir, "operator.yaml")
	os.WriteFile(opFile, []byte(op), 0o600)
	start(t, "operator", "--config", opFile)
	return dir, certs, signals
}

// drainPastDeadline opens 20 streams of 20 s on the gateway at client,
// sends it SIGTERM once each has its first event, and checks how each
// ended and how long the gateway took to exit.
func drainPastDeadline(t *testing.T, client string, gateway *process) {
	t.Helper()
	body := `{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"hi"}],"max_tokens":2000,"stream":true}`
	eventually(t, "the gateway routes", 15*time.Second, func() bool {
		resp, err := http.Post("http://"+client+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"Qwen/Qwen3-8B","max_tokens":1}`))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	const streams = 20
	type end struct {
		events            int
		last              string
		done, interrupted bool
		err               error
	}
	ends := make([]end, streams)
	var opened, wg sync.WaitGroup
	opened.Add(streams)
	for i := range streams {
		wg.Go(func() {
			e := &ends[i]
			resp, err := http.Post("http://"+client+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				e.err = err
				opened.Done()
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line := sc.Text()
				if !strings.HasPrefix(line, "data: ") {
					continue
				}
				if e.events++; e.events == 1 {
					opened.Done()
				}
				e.last = line
				e.done = e.done || line == "data: [DONE]"
				e.interrupted = e.interrupted || strings.Contains(line, `"code":"stream_interrupted"`) && strings.Contains(line, "gateway shut down")
			}
			e.err = sc.Err()
			if e.events == 0 {
				opened.Done()
			}
		})
	}
	opened.Wait()
	began := time.Now()
	if code := gateway.stop(t); code != 0 {
		t.Errorf("the gateway exited %d after its drain timed out", code)
	}
	took := time.Since(began)
	wg.Wait()
	for i, e := range ends {
		if e.err != nil || e.done || !e.interrupted || !strings.Contains(e.last, "stream_interrupted") {
			t.Errorf("stream %d: %d events, last %q, [DONE] %v, error %v; want the terminal event last and a clean end", i, e.events, e.last, e.done, e.err)
		}
	}
	if took > 5*time.Second {
		t.Errorf("the gateway took %v to exit with a 1 s drain", took)
	}
}

// TestRestartInPlaceLosesNoRequest: a gateway replaced in place, as a
// rolling update without a load balancer does it (reusePort: the new
// process binds the old one's addresses, then the old one gets SIGTERM),
// while 8 clients send short completions back to back on kept-alive
// connections and 4 stream. The old gateway closes its listener, answers
// what comes on its connections for a second with Connection: close, and
// only then closes the idle ones: no client sees an error. Closing idle
// connections at once failed requests their clients were writing (EOF:
// 6 to 23 of about 1,050 in each restart of grid bench sites).
func TestRestartInPlaceLosesNoRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	dir, certs, signals := startEastEngine(t, "--slots", "64", "--ttft", "1ms", "--tpot", "1ms")
	client, hop := freePort(t), freePort(t)
	old := startInPlaceGateway(t, dir, certs, "east", client, hop, signals, 1)
	sendAcross(t, client, func() {
		startInPlaceGateway(t, dir, certs, "east", client, hop, signals, 2)
		if code := old.stop(t); code != 0 {
			t.Errorf("the replaced gateway exited %d", code)
		}
	})
}

// startInPlaceGateway starts replacement n of site's gateway on the client
// and hop addresses every replacement shares (reusePort), polling the
// operator at signals, and waits until it is ready.
func startInPlaceGateway(t *testing.T, dir, certs, site, client, hop, signals string, n int) *process {
	t.Helper()
	metrics := freePort(t)
	gw := fmt.Sprintf("site: %[6]s\ntls: {ca: %[1]s/ca.crt, cert: %[1]s/%[6]s.crt, key: %[1]s/%[6]s.key}\nlisten: %[2]q\nhop: {listen: %[3]q}\nmetrics: {listen: %[4]q}\nreusePort: true\noperator: {signals: \"https://%[5]s\"}\npollInterval: 250ms\n",
		certs, client, hop, metrics, signals, site)
	file := filepath.Join(dir, fmt.Sprintf("gateway-%s-%d.yaml", site, n))
	os.WriteFile(file, []byte(gw), 0o600)
	p := start(t, "gateway", "--config", file, "--drain-timeout", "5s")
	eventually(t, fmt.Sprintf("%s's gateway %d is ready", site, n), 15*time.Second, func() bool {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// sendAcross runs 8 clients of short completions back to back on
// kept-alive connections and 4 of streams against the gateway at client,
// for a second before event and a second after it, and fails the test for
// every request that did not end whole.
func sendAcross(t *testing.T, client string, event func()) {
	t.Helper()
	var (
		mu     sync.Mutex
		sent   int
		failed []string
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	send := func(stream bool) {
		defer wg.Done()
		c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
		defer c.CloseIdleConnections()
		body := fmt.Sprintf(`{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":%v}`, stream)
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := c.Post("http://"+client+"/v1/chat/completions", "application/json", strings.NewReader(body))
			outcome := ""
			if err != nil {
				outcome = err.Error()
			} else {
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case rerr != nil:
					outcome = "body: " + rerr.Error()
				case resp.StatusCode != http.StatusOK:
					outcome = fmt.Sprintf("status %d: %s", resp.StatusCode, b)
				case stream && !strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]"):
					outcome = "stream without [DONE]"
				}
			}
			mu.Lock()
			sent++
			if outcome != "" {
				failed = append(failed, outcome)
			}
			mu.Unlock()
		}
	}
	for i := range 12 {
		wg.Add(1)
		go send(i >= 8)
	}
	time.Sleep(time.Second) // the clients' connections are open and kept alive
	event()
	time.Sleep(time.Second) // the clients go on after it
	close(stop)
	wg.Wait()
	t.Logf("%d requests across the event, %d failed", sent, len(failed))
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed across the event; first: %s", len(failed), sent, failed[0])
	}
}

// TestPeerRestartInPlaceLosesNoRequest: the same in-place replacement, of
// the gateway of the site that serves every request of east's clients
// (east's own engine is out of service), so each request crosses the hop
// to the gateway being replaced. A request east's gateway sends on the old
// peer's hop connection just as that peer's graceful shutdown refuses new
// streams was not processed there, and is sent again (on the new process,
// through the shared port): no client sees an error. Before the outbound
// request let the transport read its body again, 2 or 3 of about 2,200
// requests got a 502 in each of three runs.
func TestPeerRestartInPlaceLosesNoRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	gridCerts(t, certs, "east", "west")
	engine := freePort(t)
	start(t, "sim", "--kind", "vllm", "--listen", engine, "--slots", "64", "--ttft", "1ms", "--tpot", "1ms")
	signals := map[string]string{"east": freePort(t), "west": freePort(t)}
	hops := map[string]string{"east": freePort(t), "west": freePort(t)}
	clients := map[string]string{"east": freePort(t), "west": freePort(t)}
	peer := map[string]string{"east": "west", "west": "east"}
	for _, site := range []string{"east", "west"} {
		// Both sites' providers are the one engine; east's is out of
		// service, so east's gateway sends everything to west.
		op := fmt.Sprintf("site: %[6]s\ntls: {ca: %[1]s/ca.crt, cert: %[1]s/%[6]s.crt, key: %[1]s/%[6]s.key}\nsignals: {listen: %[2]q}\nmetrics: {listen: %[3]q}\nstateDir: %[4]s\nscrapeInterval: 200ms\npeerPollInterval: 1s\npeers:\n  - {site: %[7]s, signals: \"https://%[8]s\", gateway: \"https://%[9]s\"}\nproviders:\n  - {name: %[6]s-engine, model: Qwen/Qwen3-8B, kind: vllm, upstream: \"http://%[5]s\", metrics: {endpoint: \"http://%[5]s\"}, unavailable: %[10]v}\n",
			certs, signals[site], freePort(t), filepath.Join(dir, "state-"+site), engine, site, peer[site], signals[peer[site]], hops[peer[site]], site == "east")
		file := filepath.Join(dir, site+"-operator.yaml")
		os.WriteFile(file, []byte(op), 0o600)
		start(t, "operator", "--config", file)
	}
	gateway := func(site string, n int) *process {
		return startInPlaceGateway(t, dir, certs, site, clients[site], hops[site], signals[site], n)
	}
	oldWest := gateway("west", 1)
	gateway("east", 1)
	eventually(t, "east's gateway routes to west", 30*time.Second, func() bool {
		resp, err := http.Post("http://"+clients["east"]+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"Qwen/Qwen3-8B","max_tokens":1}`))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && resp.Header.Get("X-Grid-Site") == "west"
	})
	sendAcross(t, clients["east"], func() {
		gateway("west", 2)
		if code := oldWest.stop(t); code != 0 {
			t.Errorf("west's replaced gateway exited %d", code)
		}
	})
}
