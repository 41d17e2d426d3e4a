package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// gridBinary is built once per test run by TestMain.
var gridBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "grid-e2e")
	if err != nil {
		panic(err)
	}
	gridBinary = filepath.Join(dir, "grid")
	out, err := exec.Command("go", "build", "-race", "-o", gridBinary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build grid: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	// Every goroutine the tests started (process pipes, clients, fault
	// proxies) must have ended with them.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// portCursor walks the ports freePort hands out: from a per-process start
// in 20000–29999, below Linux's ephemeral range (32768 and up), so that no
// outgoing connection of any process takes a port between freePort's check
// and the child process binding it, and no port is handed out twice.
var portCursor atomic.Int32

func init() { portCursor.Store(int32(20000 + os.Getpid()%800*10)) }

// freePort returns a loopback address nobody listens on, for a child
// process to bind.
func freePort(t *testing.T) string {
	t.Helper()
	for range 1000 {
		port := portCursor.Add(1)
		if port >= 30000 {
			portCursor.CompareAndSwap(port, 20000)
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free loopback port in 20000–29999")
	return ""
}

// process is a grid subcommand running for the test.
type process struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	out bytes.Buffer
}

func start(t *testing.T, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(gridBinary, args...)}
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
		pw.Close()
		if t.Failed() {
			t.Logf("output of grid %v:\n%s", args, p.output())
		}
	})
	return p
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// stop sends SIGTERM and returns the exit code.
func (p *process) stop(t *testing.T) int {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(15 * time.Second):
		t.Fatal("did not exit within 15s of SIGTERM")
		return -1
	}
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func httpGet(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestOperatorBinaryAgainstSims runs `grid sim` of each kind and a `grid
// operator` scraping them, as a user would: the operator reports every
// provider ready, rejects a bad reload without losing anything, applies a
// good one, and drains on SIGTERM with exit status 0.
func TestOperatorBinaryAgainstSims(t *testing.T) {
	kinds := []string{"epp", "vllm", "sglang"}
	sims := map[string]string{}
	for _, kind := range kinds {
		addr := freePort(t)
		start(t, "sim", "--kind", kind, "--listen", addr, "--endpoints", "2", "--metrics-token", "tok-"+kind)
		sims[kind] = addr
	}
	dir := t.TempDir()
	metricsAddr := freePort(t)
	var providers strings.Builder
	for _, kind := range kinds {
		tokenFile := filepath.Join(dir, kind+".token")
		os.WriteFile(tokenFile, []byte("tok-"+kind+"\n"), 0o600)
		fmt.Fprintf(&providers, "  - {name: %s-pool, model: Qwen/Qwen3-8B, kind: %s, upstream: 'http://%s', metrics: {endpoint: 'http://%s', bearerTokenFile: %s}}\n",
			kind, kind, sims[kind], sims[kind], tokenFile)
	}
	cfgFile := filepath.Join(dir, "site.yaml")
	good := fmt.Sprintf("site: east\nstateDir: %s\nmetrics: {listen: %q}\nscrapeInterval: 200ms\nproviders:\n%s", filepath.Join(dir, "state"), metricsAddr, providers.String())
	os.WriteFile(cfgFile, []byte(good), 0o600)

	op := start(t, "--log-format", "json", "operator", "--config", cfgFile)
	metrics := func() string { return httpGet("http://" + metricsAddr + "/metrics") }
	eventually(t, "every provider ready", 15*time.Second, func() bool {
		m := metrics()
		for _, kind := range kinds {
			if !strings.Contains(m, fmt.Sprintf(`grid_provider_ready{grid_provider="%s-pool",grid_site="east"} 1`, kind)) {
				return false
			}
		}
		return true
	})
	if r := httpGet("http://" + metricsAddr + "/readyz"); r != "ok\n" {
		t.Errorf("/readyz: %q", r)
	}

	// A broken file is rejected whole; the running configuration stays.
	os.WriteFile(cfgFile, []byte(good+"bogusKey: 1\n"), 0o600)
	op.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, "rejected reload counted", 10*time.Second, func() bool {
		return strings.Contains(metrics(), `grid_config_reload_total{result="rejected"} 1`)
	})
	if !strings.Contains(op.output(), "bogusKey") {
		t.Error("the rejection log does not name the bad key")
	}
	if !strings.Contains(metrics(), `grid_provider_ready{grid_provider="epp-pool",grid_site="east"} 1`) {
		t.Error("a rejected reload disturbed the providers")
	}

	// A good reload that drops a provider applies.
	trimmed := strings.Replace(good, providers.String(), strings.SplitAfterN(providers.String(), "\n", 2)[0], 1)
	os.WriteFile(cfgFile, []byte(trimmed), 0o600)
	op.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, "applied reload", 10*time.Second, func() bool {
		m := metrics()
		return strings.Contains(m, `grid_config_reload_total{result="applied"} 1`) && !strings.Contains(m, `grid_provider="sglang-pool"`)
	})

	if code := op.stop(t); code != 0 {
		t.Errorf("operator exited %d on SIGTERM", code)
	}
}

// gridCerts makes a grid CA in dir with `grid certs init` and issues each
// site's certificate with `grid certs issue`.
func gridCerts(t *testing.T, dir string, sites ...string) {
	t.Helper()
	runs := [][]string{{"certs", "init", "--dir", dir}}
	for _, site := range sites {
		runs = append(runs, []string{"certs", "issue", "--dir", dir, "--site", site})
	}
	for _, args := range runs {
		if out, err := exec.Command(gridBinary, args...).CombinedOutput(); err != nil {
			t.Fatalf("grid %v: %v\n%s", args, err, out)
		}
	}
}

// TestTwoSitesWithGridCerts: certificates from `grid certs`, two `grid
// operator`s on loopback; each sees the other's provider on /metrics within
// two peer polls, and the signals endpoint admits exactly who it should.
func TestTwoSitesWithGridCerts(t *testing.T) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	gridCerts(t, certs, "east", "west", "north")
	sims := map[string]string{"east": freePort(t), "west": freePort(t)}
	start(t, "sim", "--kind", "epp", "--listen", sims["east"], "--endpoints", "2")
	// West's engine runs 4 at once and says so on /v1/loads; east's
	// operator is told its endpoints run 3 each.
	start(t, "sim", "--kind", "sglang", "--listen", sims["west"], "--slots", "4")
	signalsAddr := map[string]string{"east": freePort(t), "west": freePort(t)}
	hopAddr := map[string]string{"east": freePort(t), "west": freePort(t)}
	clientAddr := map[string]string{"east": freePort(t), "west": freePort(t)}
	metricsAddr := map[string]string{"east": freePort(t), "west": freePort(t)}
	kinds := map[string]string{"east": "epp", "west": "sglang"}
	maxRunning := map[string]string{"east": ", maxRunning: 3", "west": ""}
	gwMetrics := map[string]string{"east": freePort(t), "west": freePort(t)}
	for _, site := range []string{"east", "west"} {
		peer := map[string]string{"east": "west", "west": "east"}[site]
		cfg := fmt.Sprintf(`site: %[1]s
tls: {ca: %[2]s/ca.crt, cert: %[2]s/%[1]s.crt, key: %[2]s/%[1]s.key}
signals: {listen: %[3]q}
metrics: {listen: %[4]q}
stateDir: %[5]s
scrapeInterval: 200ms
peerPollInterval: 1s
peers:
  - {site: %[6]s, signals: "https://%[7]s", gateway: "https://%[10]s"}
providers:
  - {name: %[1]s-pool, model: Qwen/Qwen3-8B, kind: %[8]s, upstream: "http://%[9]s", metrics: {endpoint: "http://%[9]s"}%[11]s}
`, site, certs, signalsAddr[site], metricsAddr[site], filepath.Join(dir, "state-"+site), peer, signalsAddr[peer], kinds[site], sims[site], hopAddr[peer], maxRunning[site])
		file := filepath.Join(dir, site+".yaml")
		os.WriteFile(file, []byte(cfg), 0o600)
		start(t, "operator", "--config", file)
		gw := fmt.Sprintf(`site: %[1]s
tls: {ca: %[2]s/ca.crt, cert: %[2]s/%[1]s.crt, key: %[2]s/%[1]s.key}
listen: %[3]q
hop: {listen: %[4]q}
metrics: {listen: %[5]q}
operator: {signals: "https://%[6]s"}
`, site, certs, clientAddr[site], hopAddr[site], gwMetrics[site], signalsAddr[site])
		gwFile := filepath.Join(dir, site+"-gateway.yaml")
		os.WriteFile(gwFile, []byte(gw), 0o600)
		start(t, "gateway", "--config", gwFile)
	}
	for site, peer := range map[string]string{"east": "west", "west": "east"} {
		want := fmt.Sprintf(`grid_provider_ready{grid_provider="%s-pool",grid_site="%s"} 1`, peer, peer)
		eventually(t, site+" sees "+peer, 15*time.Second, func() bool {
			return strings.Contains(httpGet("http://"+metricsAddr[site]+"/metrics"), want)
		})
	}

	read := func(as string) (int, string, error) {
		crt, key := filepath.Join(certs, as+".crt"), filepath.Join(certs, as+".key")
		cert, err := tls.LoadX509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		caPEM, _ := os.ReadFile(filepath.Join(certs, "ca.crt"))
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "east.grid.internal",
		}}, Timeout: 5 * time.Second}
		defer c.CloseIdleConnections()
		resp, err := c.Get("https://" + signalsAddr["east"] + "/v1/site/signals")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := read("east"); err != nil || code != 200 || !strings.Contains(body, `grid_site="west"`) || !strings.Contains(body, `grid_site="east"`) {
		t.Errorf("east's certificate: %d %v\n%s", code, err, body)
	}
	if code, body, err := read("west"); err != nil || code != 200 || strings.Contains(body, `grid_site="west"`) || !strings.Contains(body, `grid_site="east"`) {
		t.Errorf("west's certificate: %d %v\n%s", code, err, body)
	}
	if code, body, err := read("north"); err != nil || code != 403 {
		t.Errorf("north's certificate: %d %v %q", code, err, body)
	}
	curlSignals(t, certs, signalsAddr["east"])
	// Through east's gateway, both sites serve requests.
	served := map[string]bool{}
	eventually(t, "both sites serve through east's gateway", 20*time.Second, func() bool {
		resp, err := http.Post("http://"+clientAddr["east"]+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				served[resp.Header.Get("X-Grid-Site")] = true
			}
		}
		return served["east"] && served["west"]
	})
	// Each unit's limit crosses the chain to a gateway that has never seen
	// a queue: east's two endpoints of 3 as configured, west's engine of
	// 4 as it declares, relayed by west's operator to east's; neither is
	// read at the floor of 8 a unit.
	ceilings := map[string]float64{}
	eventually(t, "east's gateway reads east-pool's ceiling as 6 and west-pool's as 4 (/api/snapshot)", 15*time.Second, func() bool {
		var view struct {
			Candidates []struct {
				Provider string   `json:"provider"`
				Ceiling  *float64 `json:"ceiling"`
			} `json:"candidates"`
		}
		if json.Unmarshal([]byte(httpGet("http://"+gwMetrics["east"]+"/api/snapshot")), &view) != nil {
			return false
		}
		for _, c := range view.Candidates {
			if c.Ceiling != nil {
				ceilings[c.Provider] = *c.Ceiling
			}
		}
		return ceilings["east-pool"] == 6 && ceilings["west-pool"] == 4
	})
	out, err := exec.Command(gridBinary, "status", "--metrics", "http://"+metricsAddr["east"]).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "west-pool") || !strings.Contains(string(out), "accepted") || !strings.Contains(string(out), "Ready") {
		t.Errorf("grid status: %v\n%s", err, out)
	}
}

// curlSignals reads east's signals endpoint with curl, as an operator of the
// grid would: east's own certificate gets both sites' rows, a peer's gets
// east's rows only, a site east does not peer with gets 403, and no
// certificate or one from another CA fails the handshake.
func curlSignals(t *testing.T, certs, addr string) {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Log("curl not installed; the Go client checks above stand")
		return
	}
	other := filepath.Join(t.TempDir(), "other")
	for _, args := range [][]string{{"certs", "init", "--dir", other}, {"certs", "issue", "--dir", other, "--site", "west"}} {
		if out, err := exec.Command(gridBinary, args...).CombinedOutput(); err != nil {
			t.Fatalf("grid %v: %v\n%s", args, err, out)
		}
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	// The server is named as its certificate names it, resolved to addr.
	url := "https://east.grid.internal:" + port + "/v1/site/signals"
	resolve := "east.grid.internal:" + port + ":" + host
	run := func(dir, site string) (string, error) {
		args := []string{"-sS", "--max-time", "5", "--cacert", filepath.Join(certs, "ca.crt"), "--resolve", resolve, "-w", "\n%{http_code}"}
		if site != "" {
			args = append(args, "--cert", filepath.Join(dir, site+".crt"), "--key", filepath.Join(dir, site+".key"))
		}
		out, err := exec.Command(curl, append(args, url)...).CombinedOutput()
		return string(out), err
	}
	for _, tc := range []struct {
		dir, site   string
		status      string
		east, west  bool
		handshakeOK bool
	}{
		{certs, "east", "200", true, true, true},
		{certs, "west", "200", true, false, true},
		{certs, "north", "403", false, false, true},
		{certs, "", "", false, false, false},
		{other, "west", "", false, false, false},
	} {
		out, err := run(tc.dir, tc.site)
		name := tc.site
		if tc.dir == other {
			name = "another CA's " + tc.site
		} else if name == "" {
			name = "no certificate"
		}
		if !tc.handshakeOK {
			// No HTTP answer at all (curl prints code 000) from the server
			// that has just answered the cases above. Whether curl reads
			// the TLS alert or finds the socket already closed is a race.
			if err == nil || !strings.HasSuffix(strings.TrimSpace(out), "000") {
				t.Errorf("curl with %s: want a failed handshake, got %v\n%s", name, err, out)
			}
			continue
		}
		if err != nil || !strings.HasSuffix(out, "\n"+tc.status) ||
			strings.Contains(out, `grid_site="east"`) != tc.east || strings.Contains(out, `grid_site="west"`) != tc.west {
			t.Errorf("curl with %s: %v\n%s", name, err, out)
		}
	}
}

// TestHungProviderLeavesOthersCadence: each provider is scraped on a loop of
// its own, so a provider whose /metrics hangs to its timeout (1.5 s here)
// leaves another's cadence (100 ms) as it was. Under one pass per interval,
// every pass waited for the hung scrape: about one good scrape per 1.5 s.
func TestHungProviderLeavesOthersCadence(t *testing.T) {
	good, hung := freePort(t), freePort(t)
	start(t, "sim", "--kind", "epp", "--listen", good)
	start(t, "sim", "--kind", "epp", "--listen", hung)
	eventually(t, "the sims answer", 10*time.Second, func() bool {
		return strings.Contains(httpGet("http://"+hung+"/metrics"), "llm_d_epp")
	})
	resp, err := http.Post("http://"+hung+"/sim/control", "application/json", strings.NewReader(`{"metricsHang": true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	dir := t.TempDir()
	metricsAddr := freePort(t)
	cfgFile := filepath.Join(dir, "site.yaml")
	os.WriteFile(cfgFile, []byte(fmt.Sprintf("site: east\nstateDir: %s\nmetrics: {listen: %q}\nscrapeInterval: 100ms\nproviders:\n"+
		"  - {name: good, model: m, kind: epp, upstream: 'http://%[3]s', metrics: {endpoint: 'http://%[3]s'}}\n"+
		"  - {name: hung, model: m, kind: epp, upstream: 'http://%[4]s', metrics: {endpoint: 'http://%[4]s', timeout: 1500ms}}\n",
		filepath.Join(dir, "state"), metricsAddr, good, hung)), 0o600)
	start(t, "operator", "--config", cfgFile)
	scrapes := func(provider, result string) float64 {
		for _, line := range strings.Split(httpGet("http://"+metricsAddr+"/metrics"), "\n") {
			if strings.HasPrefix(line, "grid_provider_scrape_total{") && strings.Contains(line, `grid_provider="`+provider+`"`) && strings.Contains(line, `result="`+result+`"`) {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				return v
			}
		}
		return 0
	}
	eventually(t, "the hung provider's first timeout", 15*time.Second, func() bool { return scrapes("hung", "timeout") >= 1 })
	from, before := time.Now(), scrapes("good", "success")
	eventually(t, "three seconds of the good provider's scrapes", 10*time.Second, func() bool { return time.Since(from) >= 3*time.Second })
	window, n := time.Since(from), scrapes("good", "success")-before
	// 100 ms apart: 30 in 3 s. A quarter of that allows for a loaded
	// machine; one pass per interval gave 2.
	if want := window.Seconds() / 0.4; n < want {
		t.Errorf("the good provider was scraped %v times in %v beside a hung one, want at least %.0f", n, window.Round(time.Millisecond), want)
	}
	if timeouts := scrapes("hung", "timeout"); timeouts < 2 {
		t.Errorf("the hung provider timed out %v times, want it scraped on its own cadence too", timeouts)
	}
	t.Logf("good: %v scrapes in %v; hung: %v timeouts", n, window.Round(time.Millisecond), scrapes("hung", "timeout"))
}
