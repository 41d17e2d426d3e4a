package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/gateway"
	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/operator"
	"github.com/grid-inference/grid/internal/sim"
)

// BenchmarkMultiTurn measures what affinity saves on multi-turn chats: 500
// sessions of 8 turns, each turn resending the conversation so far (a
// system prompt every session shares, a first question of its own, then
// each answer and a new question), with think time between turns, through
// a real gateway and operator to three vLLM sims of 4, 8 and 16 slots whose
// engines cache prompt prefixes (sim.Options.PrefixCacheTokens) and prefill
// only what they do not hold. Sessions start as a Poisson process at the
// rate that offers the given load against the uncached service time. It
// reports the time to first token (p50, p99) the clients saw, the requests
// completed per second, the engines' prefix-cache hit rate, and how many
// turns moved site. BENCHMARKS.md has the table and the command:
//
//	go test ./internal/gateway -run '^$' -bench 'MultiTurn$' -benchtime 1x
func BenchmarkMultiTurn(b *testing.B) { benchmarkMultiTurn(b, startAffinitySite) }

// BenchmarkMultiTurnSites is BenchmarkMultiTurn over three sites, each a
// vLLM sim, an operator and a gateway peering with the other two, the
// sessions entering by the three gateways in turn: a turn served at
// another site goes over the hop, and each gateway reads the others'
// load through their operators' peer polls.
//
//	go test ./internal/gateway -run '^$' -bench MultiTurnSites -benchtime 1x
func BenchmarkMultiTurnSites(b *testing.B) { benchmarkMultiTurn(b, startAffinityGrid) }

// topology starts the engines of the given slots and the gateways in
// front of them, with the given affinity block, and returns the gateways'
// client addresses, the sims and the gateways.
type topology func(tb testing.TB, slots []int, affinity string) ([]string, []*sim.Sim, []*gateway.Gateway)

func benchmarkMultiTurn(b *testing.B, topo topology) {
	for _, load := range []float64{0.6, 0.9} {
		for _, mode := range []string{"none", "session", "prefix"} {
			b.Run(fmt.Sprintf("load=%.1f/affinity=%s", load, mode), func(b *testing.B) {
				for range b.N {
					sessions := 500
					if os.Getenv("GRID_MULTITURN_SESSIONS") != "" {
						fmt.Sscan(os.Getenv("GRID_MULTITURN_SESSIONS"), &sessions)
					}
					r := runMultiTurn(b, topo, mode, load, sessions, 8)
					b.ReportMetric(r.ttft[len(r.ttft)/2].Seconds()*1000, "ttft-p50-ms")
					b.ReportMetric(r.ttft[len(r.ttft)*99/100].Seconds()*1000, "ttft-p99-ms")
					b.ReportMetric(float64(len(r.ttft))/r.elapsed.Seconds(), "req/s")
					b.ReportMetric(r.hitRate, "cache-hit-rate")
					b.ReportMetric(float64(r.moves)/float64(len(r.ttft)), "moved/turn")
					b.ReportMetric(float64(r.failed), "failed")
				}
			})
		}
	}
}

// The workload's shape, in the sim's units (four bytes a token): every
// session shares a system prompt of 300 tokens and opens with a document of
// its own (1,500 tokens: a file, retrieved passages); a turn adds a question
// of 100 tokens and an answer of 64 tokens (about 90 tokens of text when
// resent), so the eighth turn's prompt is about 3,300 tokens, within an
// engine's KV per slot. Prefill costs 30 µs a token beyond a fixed 2 ms: a
// cold 3,300-token prompt takes 100 ms to its first token, one whose
// conversation is cached the new 190 tokens' 8 ms.
const (
	mtSlotsTotal   = 4 + 8 + 16
	mtTTFT         = 2 * time.Millisecond
	mtPerToken     = 30 * time.Microsecond
	mtTPOT         = 2 * time.Millisecond
	mtOutput       = 64
	mtAnswerBytes  = 350
	mtSystemBytes  = 1200 // 300 tokens every session shares
	mtDocBytes     = 6000 // 1,500 tokens of the session's own
	mtQuestionSize = 400  // 100 tokens a question
	mtThink        = 300 * time.Millisecond
)

type multiTurnResult struct {
	ttft          []time.Duration // sorted
	elapsed       time.Duration
	hitRate       float64
	moves, failed int
	// The times to first token of the turns that moved site, of those
	// that stayed, and of first turns: where the tail comes from.
	ttftMoved, ttftStayed, ttftFirst []time.Duration
}

func runMultiTurn(b *testing.B, topo topology, mode string, load float64, sessions, turns int) multiTurnResult {
	b.Helper()
	affinity := map[string]string{
		"none":    "",
		"session": "affinity: {header: X-Session-Id%s}\n",
		"prefix":  "affinity: {prefix: {enabled: true}%s}\n",
	}[mode]
	threshold := ""
	if v := os.Getenv("GRID_MULTITURN_THRESHOLD"); v != "" {
		threshold = ", threshold: " + v
	}
	if mode != "none" {
		affinity = fmt.Sprintf(affinity, threshold)
	}
	addrs, sims, gws := topo(b, []int{4, 8, 16}, affinity)
	// The uncached service time of a mean turn: a prompt of the system, a
	// first question and half the turns' history, prefilled whole, then the
	// answer.
	meanPrompt := float64(mtSystemBytes+mtDocBytes+mtQuestionSize+(turns/2)*(mtQuestionSize+mtAnswerBytes)) / 4
	service := mtTTFT + time.Duration(meanPrompt)*mtPerToken + (mtOutput-1)*mtTPOT
	rate := load * mtSlotsTotal / service.Seconds() // requests per second
	startRate := rate / float64(turns)
	rng := rand.New(rand.NewPCG(1, 2))
	system := strings.Repeat("You are a careful assistant for the grid. ", mtSystemBytes/42+1)[:mtSystemBytes]

	var mu sync.Mutex
	var res multiTurnResult
	tr := &http.Transport{MaxIdleConnsPerHost: 1024}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	var wg sync.WaitGroup
	start := time.Now()
	at := start
	for s := range sessions {
		at = at.Add(time.Duration(rng.ExpFloat64() / startRate * float64(time.Second)))
		thinks := make([]time.Duration, turns)
		for i := range thinks {
			thinks[i] = time.Duration(rng.ExpFloat64() * float64(mtThink))
		}
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			doc := fmt.Sprintf("Document of session %d. ", s)
			doc += strings.Repeat(fmt.Sprintf("Passage %d of a document only this session reads. ", s), mtDocBytes/40+1)[:mtDocBytes-len(doc)]
			messages := []string{fmt.Sprintf(`{"role":"system","content":%q}`, system), fmt.Sprintf(`{"role":"user","content":%q}`, doc)}
			last := ""
			for turn := range turns {
				question := fmt.Sprintf("Session %d, question %d: ", s, turn)
				question += strings.Repeat("tell me more about routing. ", mtQuestionSize/28+1)[:mtQuestionSize-len(question)]
				messages = append(messages, fmt.Sprintf(`{"role":"user","content":%q}`, question))
				body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[%s]}`, sim.DefaultModel, mtOutput, strings.Join(messages, ","))
				// A session enters by one gateway, its users' own.
				req, _ := http.NewRequest(http.MethodPost, "http://"+addrs[s%len(addrs)]+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if mode == "session" {
					req.Header.Set("X-Session-Id", fmt.Sprint("session-", s))
				}
				ttft, answer, site, err := streamTurn(client, req)
				mu.Lock()
				if err != nil {
					res.failed++
					mu.Unlock()
					return
				}
				res.ttft = append(res.ttft, ttft)
				if last != "" && site != last {
					res.moves++
					res.ttftMoved = append(res.ttftMoved, ttft)
				} else if last != "" {
					res.ttftStayed = append(res.ttftStayed, ttft)
				} else {
					res.ttftFirst = append(res.ttftFirst, ttft)
				}
				mu.Unlock()
				last = site
				messages = append(messages, fmt.Sprintf(`{"role":"assistant","content":%q}`, answer))
				time.Sleep(thinks[turn]) // the user reads the answer, then writes
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	slices.Sort(res.ttft)
	p99 := res.ttft[len(res.ttft)*99/100]
	for _, part := range []struct {
		name string
		ttft []time.Duration
	}{{"moved site", res.ttftMoved}, {"stayed", res.ttftStayed}, {"were first", res.ttftFirst}} {
		if len(part.ttft) == 0 {
			continue
		}
		slices.Sort(part.ttft)
		inTail := len(part.ttft) - sort.Search(len(part.ttft), func(i int) bool { return part.ttft[i] >= p99 })
		b.Logf("turns that %s: %d, TTFT p50 %v p99 %v, %d of them in the slowest 1%% of all", part.name, len(part.ttft),
			part.ttft[len(part.ttft)/2].Round(time.Millisecond), part.ttft[len(part.ttft)*99/100].Round(time.Millisecond), inTail)
	}
	var hits, queries int64
	for _, s := range sims {
		l := s.Engines()[0].Load()
		hits, queries = hits+l.CacheHits, queries+l.CacheQueries
	}
	if queries > 0 {
		res.hitRate = float64(hits) / float64(queries)
	}
	if len(res.ttft) == 0 {
		b.Fatal("no turn completed")
	}
	for k, gw := range gws {
		rec := httptest.NewRecorder()
		gw.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if strings.HasPrefix(l, "grid_route_affinity_total") || strings.HasPrefix(l, "grid_route_decisions_total") || strings.HasPrefix(l, "grid_route_site_ceiling") {
				b.Logf("gateway %d: %s", k, l)
			}
		}
	}
	return res
}

// streamTurn sends one streaming turn and returns its time to first token,
// the answer's text and the site that served it.
func streamTurn(c *http.Client, req *http.Request) (time.Duration, string, string, error) {
	sent := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, "", "", fmt.Errorf("status %d", resp.StatusCode)
	}
	var ttft time.Duration
	var answer strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") || line == "data: [DONE]" {
			continue
		}
		if ttft == 0 {
			ttft = time.Since(sent)
		}
		if i := strings.Index(line, `"content":"`); i >= 0 {
			rest := line[i+len(`"content":"`):]
			answer.WriteString(rest[:strings.IndexByte(rest, '"')])
		}
	}
	if ttft == 0 {
		return 0, "", "", fmt.Errorf("no token: %v", sc.Err())
	}
	return ttft, answer.String(), resp.Header.Get("X-Grid-Site") + "/" + resp.Header.Get("X-Grid-Backend"), sc.Err()
}

// startAffinitySite runs one site: a vLLM sim per entry of slots (one
// engine each, caching prefixes), an operator scraping them every 100 ms as
// providers p0, p1, …, and a gateway with the given affinity block. It
// returns the gateway's client address, the sims and the gateway.
func startAffinitySite(tb testing.TB, slots []int, affinity string) ([]string, []*sim.Sim, []*gateway.Gateway) {
	tb.Helper()
	dir := tb.TempDir()
	identity.Init(dir, "grid.internal", time.Now())
	identity.Issue(dir, "east", nil, time.Now())
	var sims []*sim.Sim
	var providers strings.Builder
	for i, n := range slots {
		s, url := startCachingSim(tb, n)
		sims = append(sims, s)
		fmt.Fprintf(&providers, "  - {name: p%d, model: %s, kind: vllm, upstream: 'http://%s', metrics: {endpoint: 'http://%s'}}\n", i, sim.DefaultModel, url, url)
	}
	signalsLn, signalsAddr := listenAny(tb)
	id := startBenchOperator(tb, "east", fmt.Sprintf("site: east\n%sstateDir: %s\nscrapeInterval: 100ms\nproviders:\n%s",
		benchTLS(dir, "east"), tb.TempDir(), providers.String()), signalsLn)
	clientLn, clientAddr := listenAny(tb)
	gw := startBenchGateway(tb, "east", fmt.Sprintf("site: east\n%soperator: {signals: 'https://%s'}\npollInterval: 200ms\n%s",
		benchTLS(dir, "east"), signalsAddr, affinity), id)
	serve(tb, clientLn, gw.ClientHandler(), nil)
	waitMeasured(tb, []*gateway.Gateway{gw}, len(slots))
	return []string{clientAddr}, sims, []*gateway.Gateway{gw}
}

// startAffinityGrid runs a site per entry of slots, s0, s1, …: each a vLLM
// sim of those slots (one engine, caching prefixes) scraped every 100 ms,
// an operator that peers with every other site (peer polls every 200 ms,
// long polls answering on change), and a gateway with the given affinity
// block, serving its clients as `grid gateway` does and its peers over the
// mTLS hop. It returns the gateways' client addresses, the sims and the
// gateways, once every gateway has measured every site.
func startAffinityGrid(tb testing.TB, slots []int, affinity string) ([]string, []*sim.Sim, []*gateway.Gateway) {
	tb.Helper()
	dir := tb.TempDir()
	identity.Init(dir, "grid.internal", time.Now())
	type site struct {
		name, simURL, client, hop, signals string
		lns                                map[string]net.Listener
	}
	sites := make([]*site, len(slots))
	var sims []*sim.Sim
	for i, n := range slots {
		st := &site{name: fmt.Sprint("s", i), lns: map[string]net.Listener{}}
		identity.Issue(dir, st.name, nil, time.Now())
		for _, l := range []struct {
			key  string
			addr *string
		}{{"client", &st.client}, {"hop", &st.hop}, {"signals", &st.signals}} {
			st.lns[l.key], *l.addr = listenAny(tb)
		}
		var sm *sim.Sim
		sm, st.simURL = startCachingSim(tb, n)
		sims = append(sims, sm)
		sites[i] = st
	}
	var addrs []string
	var gws []*gateway.Gateway
	for i, st := range sites {
		var peers strings.Builder
		for _, p := range sites {
			if p != st {
				fmt.Fprintf(&peers, "  - {site: %s, signals: 'https://%s', gateway: 'https://%s'}\n", p.name, p.signals, p.hop)
			}
		}
		id := startBenchOperator(tb, st.name, fmt.Sprintf("site: %s\n%sstateDir: %s\nscrapeInterval: 100ms\npeerPollInterval: 200ms\npeers:\n%sproviders:\n  - {name: p%d, model: %s, kind: vllm, upstream: 'http://%s', metrics: {endpoint: 'http://%s'}}\n",
			st.name, benchTLS(dir, st.name), tb.TempDir(), peers.String(), i, sim.DefaultModel, st.simURL, st.simURL), st.lns["signals"])
		gw := startBenchGateway(tb, st.name, fmt.Sprintf("site: %s\n%slisten: %q\nhop: {listen: %q}\nmetrics: {listen: '127.0.0.1:0'}\noperator: {signals: 'https://%s'}\npollInterval: 200ms\n%s",
			st.name, benchTLS(dir, st.name), st.client, st.hop, st.signals, affinity), id)
		srv := gw.Server(gateway.ClientListener, nil)
		go srv.Serve(gw.Guard(gateway.ClientListener, st.lns["client"], nil))
		tb.Cleanup(func() { srv.Close() })
		serve(tb, st.lns["hop"], gw.HopHandler(), gateway.HopTLS(id))
		addrs = append(addrs, st.client)
		gws = append(gws, gw)
	}
	waitMeasured(tb, gws, len(slots))
	return addrs, sims, gws
}

// benchTLS is the tls block of site's configuration, its files in dir.
func benchTLS(dir, site string) string {
	return fmt.Sprintf("tls: {ca: %q, cert: %q, key: %q}\n", filepath.Join(dir, "ca.crt"), filepath.Join(dir, site+".crt"), filepath.Join(dir, site+".key"))
}

// startCachingSim serves a vLLM sim of the given slots, one engine that
// caches prompt prefixes, with the workload's timings, until the benchmark
// ends; it returns the sim and its address.
func startCachingSim(tb testing.TB, slots int) (*sim.Sim, string) {
	s, err := sim.New(sim.Options{Kind: sim.KindVLLM, Slots: slots, TTFT: mtTTFT, TPOT: mtTPOT, PrefillPerToken: mtPerToken, PrefixCacheTokens: 400_000})
	if err != nil {
		tb.Fatal(err)
	}
	ln, url := listenAny(tb)
	serve(tb, ln, s.Handler(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
	return s, url
}

// startBenchOperator runs the operator of site's configuration (yaml),
// its scrapes, peer polls and signals listener on signals, until the
// benchmark ends; it returns the site's identity.
func startBenchOperator(tb testing.TB, site, yaml string, signals net.Listener) *identity.Source {
	opCfg, err := config.ParseOperator(site+".yaml", []byte(yaml))
	if err != nil {
		tb.Fatal(err)
	}
	id, err := identity.LoadSource(*opCfg.TLS, "grid.internal", site, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	state, err := operator.OpenState(opCfg.StateDir, time.Now().UnixMilli(), opCfg.Providers, operator.OpenOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	op, err := operator.New(opCfg, state, operator.Options{Identity: id})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); op.Run(ctx) }()
	go func() { defer wg.Done(); op.RunPeers(ctx) }()
	go func() { defer wg.Done(); op.ServeSignals(ctx, signals, operator.DefaultLimits, time.Second) }()
	tb.Cleanup(func() { cancel(); wg.Wait(); op.Close() })
	return id
}

// startBenchGateway runs the gateway of site's configuration (yaml) until
// the benchmark ends; its listeners are the caller's to serve.
func startBenchGateway(tb testing.TB, site, yaml string, id *identity.Source) *gateway.Gateway {
	gwCfg, err := config.ParseGateway(site+"-gw.yaml", []byte(yaml))
	if err != nil {
		tb.Fatal(err)
	}
	gw, err := gateway.New(gwCfg, gateway.Options{Identity: id})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { gw.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done; gw.Close() })
	return gw
}

// waitMeasured returns once every gateway has measured n providers.
func waitMeasured(tb testing.TB, gws []*gateway.Gateway, n int) {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ready := 0
		for _, gw := range gws {
			measured := 0
			for _, c := range gw.Snapshot().Candidates {
				if c.Measured {
					measured++
				}
			}
			if measured == n {
				ready++
			}
		}
		if ready == len(gws) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d gateways measure all %d providers after 30 s", ready, len(gws), n)
		}
	}
}
