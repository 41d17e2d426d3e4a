package sitebench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/grid-inference/grid/internal/faultproxy"
	"github.com/grid-inference/grid/internal/identity"
)

// proc is one child process of the benchmark: a grid subcommand or nginx.
// Its output is kept, bounded, for the error that says why it failed.
type proc struct {
	name string
	args []string
	cmd  *exec.Cmd
	out  *tailBuffer
	done chan struct{}
}

// tailBuffer keeps the last 16 KiB a process wrote.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 16<<10; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// startProc starts bin with args.
func startProc(name, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, args: args, cmd: exec.Command(bin, args...), out: &tailBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop ends the process: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) { p.stopWith(syscall.SIGTERM, grace) }

// stopWith sends sig and waits grace for the process to exit, then kills
// it.
func (p *proc) stopWith(sig os.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// kill ends the process at once, as a crash would.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// Ports handed to children: below Linux's default ephemeral range
// (32768–60999, net.ipv4.ip_local_port_range), in turn. A port the kernel
// picks for a listener is from the ephemeral range, and between the check
// and the child's bind an outgoing connection of the cell (thousands a
// cell) may take it: a gateway then failed to start with "address already
// in use". Handed out in turn, a port comes again only after every other.
const (
	firstChildPort = 20000
	lastChildPort  = 32767
)

// nextPort is the next port freeAddr tries; a restart's goroutines ask
// together.
var nextPort struct {
	sync.Mutex
	port int
}

// freeAddr returns a loopback address nothing listens on now, for a child
// to bind, on a port no outgoing connection takes.
func freeAddr() (string, error) {
	nextPort.Lock()
	defer nextPort.Unlock()
	if nextPort.port == 0 {
		// Another benchmark on the machine starts elsewhere in the range.
		nextPort.port = firstChildPort + os.Getpid()%(lastChildPort-firstChildPort+1)
	}
	for range lastChildPort - firstChildPort + 1 {
		port := nextPort.port
		if nextPort.port++; nextPort.port > lastChildPort {
			nextPort.port = firstChildPort
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use
		}
		l.Close()
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("no free loopback port in %d-%d", firstChildPort, lastChildPort)
}

// site is one site of the benchmark grid: its sim, and for Grid its
// operator and gateway replicas.
type site struct {
	name  string
	slots int
	// endpoints of 8 slots (or one of slots, below 8).
	endpoints, perEngine int
	sim                  string // the sim's address
	simProc              *proc
	signals, opMetrics   string
	op                   *proc
	// replicas are the entry points: the gateways' client listeners, or
	// the nginx instances'.
	replicas  []string
	hops      []string
	gwMetrics []string
	gws       []*proc
}

// stack is every process of one cell, and the wide-area links between
// its sites (the wan scenario; none otherwise). Only the cell's goroutine
// touches it, but for restarts, which touch one replica each.
type stack struct {
	bin, dir string
	timing   Timing
	sites    []*site
	nginx    []*proc
	router   Router
	links    map[link]*faultproxy.Proxy
}

// link is the way from one site to an address of another: a delaying
// proxy in front of the address.
type link struct{ from, to, target string }

// WANDelays are the one-way delays of the wan scenario's links, spread
// evenly over the pairs of sites in order (s0–s1, s0–s2, …, s1–s2, …): for
// three sites 30, 55 and 80 ms each way, the same both ways.
var WANDelays = [2]time.Duration{30 * time.Millisecond, 80 * time.Millisecond}

// wanDelay is the one-way delay between sites i < j of n.
func wanDelay(i, j, n int) time.Duration {
	pairs, p := n*(n-1)/2, 0
	for a := range i {
		p += n - 1 - a
	}
	p += j - i - 1
	if pairs < 2 {
		return WANDelays[0]
	}
	return WANDelays[0] + (WANDelays[1]-WANDelays[0])*time.Duration(p)/time.Duration(pairs-1)
}

// startLinks puts a delaying proxy on every way from one site to another
// site's operator, gateway and engines: what crosses sites crosses the
// wide area, for Grid (peer polls, the hop) and nginx (its remote
// upstreams) alike.
func (st *stack) startLinks() error {
	st.links = map[link]*faultproxy.Proxy{}
	for i, a := range st.sites {
		for j, b := range st.sites {
			if i == j {
				continue
			}
			d := wanDelay(min(i, j), max(i, j), len(st.sites))
			for _, target := range []string{b.signals, b.hops[0], b.sim} {
				p, err := faultproxy.Start(target)
				if err != nil {
					return fmt.Errorf("wide-area link %s to %s: %w", a.name, b.name, err)
				}
				p.SetDelay(d)
				st.links[link{a.name, b.name, target}] = p
			}
		}
	}
	return nil
}

// reach is the address site from reaches target, an address of site to,
// at: through their link when there is one.
func (st *stack) reach(from, to *site, target string) string {
	if p, ok := st.links[link{from.name, to.name, target}]; ok {
		return p.Addr()
	}
	return target
}

// linkSites names the site behind each link's address.
func (st *stack) linkSites() map[string]string {
	out := map[string]string{}
	for l, p := range st.links {
		out[p.Addr()] = l.to
	}
	return out
}

// newSites lays out the sites and their addresses.
func newSites(slots []int, replicas int) ([]*site, error) {
	var out []*site
	for i, n := range slots {
		s := &site{name: fmt.Sprintf("s%d", i), slots: n, endpoints: 1, perEngine: n}
		if n >= 8 && n%8 == 0 {
			s.endpoints, s.perEngine = n/8, 8
		}
		addrs := make([]string, 3+3*replicas)
		for k := range addrs {
			a, err := freeAddr()
			if err != nil {
				return nil, err
			}
			addrs[k] = a
		}
		s.sim, s.signals, s.opMetrics = addrs[0], addrs[1], addrs[2]
		for k := range replicas {
			s.replicas = append(s.replicas, addrs[3+3*k])
			s.hops = append(s.hops, addrs[4+3*k])
			s.gwMetrics = append(s.gwMetrics, addrs[5+3*k])
		}
		out = append(out, s)
	}
	return out, nil
}

// startSims starts every site's sim.
func (st *stack) startSims() error {
	for _, s := range st.sites {
		if err := st.startSim(s); err != nil {
			return err
		}
	}
	return nil
}

func (st *stack) startSim(s *site) error {
	args := []string{"sim", "--kind", "epp", "--listen", s.sim, "--model", Model,
		"--endpoints", fmt.Sprint(s.endpoints), "--slots", fmt.Sprint(s.perEngine),
		"--ttft", st.timing.TTFT.String(), "--tpot", st.timing.TPOT.String(), "--prefill-per-token", st.timing.PrefillPerToken.String(),
		"--refresh-interval", st.timing.EPPRefresh.String()}
	if st.timing.SharedPrefill {
		args = append(args, "--shared-prefill")
	}
	p, err := startProc(s.name+" sim", st.bin, args...)
	if err != nil {
		return err
	}
	s.simProc = p
	return waitHTTP(p, "http://"+s.sim+"/sim/control", 10*time.Second)
}

// startGrid writes the certificates and configurations and starts every
// site's operator and gateway replicas.
func (st *stack) startGrid() error {
	certs := filepath.Join(st.dir, "certs")
	if err := identity.Init(certs, "grid.internal", time.Now()); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	for _, s := range st.sites {
		if err := identity.Issue(certs, s.name, []string{"localhost"}, time.Now()); err != nil {
			return fmt.Errorf("certificates: %w", err)
		}
	}
	for _, s := range st.sites {
		if err := st.startOperator(s, certs); err != nil {
			return err
		}
	}
	for _, s := range st.sites {
		for k := range s.replicas {
			if err := st.startGateway(s, k, certs); err != nil {
				return err
			}
		}
	}
	return nil
}

func tlsBlock(certs, site string) string {
	crt, key := identity.SiteFiles(certs, site)
	return fmt.Sprintf("tls: {ca: %q, cert: %q, key: %q}", filepath.Join(certs, "ca.crt"), crt, key)
}

func (st *stack) startOperator(s *site, certs string) error {
	var peers strings.Builder
	for _, o := range st.sites {
		if o != s {
			// A peer's gateway is its first replica, as a load balancer's
			// address would be.
			fmt.Fprintf(&peers, "  - {site: %s, signals: \"https://%s\", gateway: \"https://%s\"}\n", o.name, st.reach(s, o, o.signals), st.reach(s, o, o.hops[0]))
		}
	}
	cfg := fmt.Sprintf("site: %s\n%s\nsignals: {listen: %q}\nmetrics: {listen: %q}\nstateDir: %q\npeers:\n%sproviders:\n"+
		"  - {name: %s-pool, model: %s, kind: epp, upstream: \"http://%s\", metrics: {endpoint: \"http://%s\", refreshInterval: %s}}\n",
		s.name, tlsBlock(certs, s.name), s.signals, s.opMetrics, filepath.Join(st.dir, "state-"+s.name), peers.String(), s.name, Model, s.sim, s.sim, st.timing.EPPRefresh)
	file := filepath.Join(st.dir, s.name+"-operator.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		return err
	}
	p, err := startProc(s.name+" operator", st.bin, "operator", "--config", file)
	if err != nil {
		return err
	}
	s.op = p
	return waitHTTP(p, "http://"+s.opMetrics+"/healthz", 15*time.Second)
}

func (st *stack) startGateway(s *site, k int, certs string) error {
	p, err := st.launchGateway(s, k, certs)
	if err != nil {
		return err
	}
	if k < len(s.gws) {
		s.gws[k] = p
	} else {
		s.gws = append(s.gws, p)
	}
	return waitHTTP(p, "http://"+s.gwMetrics[k]+"/healthz", 15*time.Second)
}

// launchGateway starts replica k of site s on its addresses. Its listeners
// are bound with SO_REUSEPORT, so a replacement can start beside it.
func (st *stack) launchGateway(s *site, k int, certs string) (*proc, error) {
	availability := ""
	if st.router.Availability != "" {
		availability = "availability: {" + st.router.Availability + "}\n"
	}
	cfg := fmt.Sprintf("site: %s\n%s\nlisten: %q\nhop: {listen: %q}\nmetrics: {listen: %q}\nreusePort: true\noperator: {signals: \"https://%s\"}\n%s",
		s.name, tlsBlock(certs, s.name), s.replicas[k], s.hops[k], s.gwMetrics[k], s.signals, availability)
	file := filepath.Join(st.dir, fmt.Sprintf("%s-gateway-%d.yaml", s.name, k))
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	return startProc(fmt.Sprintf("%s gateway %d", s.name, k), st.bin, "gateway", "--config", file, "--drain-timeout", gatewayDrain.String())
}

// gatewayDrain is the gateways' --drain-timeout: longer than the longest
// request (2,048 output tokens at 20 ms a token is 41 s), as a rolling
// update's grace period would be, so a replaced gateway finishes what it
// holds as nginx's graceful stop does (its workers outlive a killed
// master). At 5 s, a restart at 20 ms a token cut 19–21 requests a run.
const gatewayDrain = 60 * time.Second

// restartGateways replaces every gateway replica at once, as a rolling
// update replaces each behind its load balancer (the restart scenario);
// operators stay up. Each replacement starts on its replica's client and
// hop addresses beside the old process (SO_REUSEPORT) with a metrics
// address of its own, so its /readyz is its own; once it has read its
// operator the old one gets SIGTERM, stops accepting and drains while the
// new one takes every new connection. The replacement knows only what its
// operator holds.
func (st *stack) restartGateways(certs string) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		first = cmp.Or(first, err)
		mu.Unlock()
	}
	for _, s := range st.sites {
		for k := range s.replicas {
			// Each goroutine touches only replica k of its site.
			wg.Go(func() {
				old := s.gws[k]
				metrics, err := freeAddr()
				if err != nil {
					fail(err)
					return
				}
				s.gwMetrics[k] = metrics
				p, err := st.launchGateway(s, k, certs)
				if err != nil {
					fail(err)
					return
				}
				s.gws[k] = p
				if err := waitHTTP(p, "http://"+metrics+"/readyz", 15*time.Second); err != nil {
					fail(err)
				}
				old.stop(gatewayDrain + 10*time.Second)
			})
		}
	}
	wg.Wait()
	return first
}

// upstream is one server of an nginx upstream block.
type upstream struct {
	addr   string
	weight int
}

// nginxUpstreams are the servers of site s's nginx instances: every
// site's sim, reached as s reaches it, weighted by slots; only s's own for
// a local-only router.
func (st *stack) nginxUpstreams(s *site) []upstream {
	var out []upstream
	for _, o := range st.sites {
		if o == s || !st.router.LocalOnly {
			out = append(out, upstream{st.reach(s, o, o.sim), o.slots})
		}
	}
	return out
}

// nginxConfig is one nginx instance in front of servers, weighted (by
// slots: weighted round robin), or by least connections.
func nginxConfig(servers []upstream, listen, probe, dir string, leastConn bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "worker_processes 1;\npid %s;\nerror_log %s warn;\ndaemon off;\nevents { worker_connections 8192; }\nhttp {\n", filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "error.log"))
	// Request bodies (a 20,000-token prompt is 80 KB) are held in memory:
	// the workers may not be able to write a temporary file.
	fmt.Fprintf(&b, "  access_log off;\n  client_body_buffer_size 4m;\n  client_max_body_size 16m;\n  client_body_temp_path %[1]s;\n  proxy_temp_path %[1]s;\n  fastcgi_temp_path %[1]s;\n  uwsgi_temp_path %[1]s;\n  scgi_temp_path %[1]s;\n", filepath.Join(dir, "tmp"))
	b.WriteString("  upstream sims {\n")
	if leastConn {
		b.WriteString("    least_conn;\n")
	}
	for _, u := range servers {
		fmt.Fprintf(&b, "    server %s weight=%d;\n", u.addr, u.weight)
	}
	b.WriteString("    keepalive 256;\n  }\n")
	fmt.Fprintf(&b, "  server {\n    listen %s reuseport;\n    listen %s;\n    location / {\n      proxy_pass http://sims;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n      proxy_read_timeout 300s;\n      add_header X-Upstream $upstream_addr always;\n    }\n  }\n}\n", listen, probe)
	return b.String()
}

func (st *stack) startNginx(leastConn bool) error {
	for _, s := range st.sites {
		for k := range s.replicas {
			p, err := st.launchNginx(s, k, leastConn, 0)
			if err != nil {
				return err
			}
			st.nginx = append(st.nginx, p)
		}
	}
	return nil
}

// launchNginx starts instance k of site s (its generation-th start) on the
// replica's address, bound with reuseport so a replacement can start
// beside it, and waits until it accepts on an address of its own.
func (st *stack) launchNginx(s *site, k int, leastConn bool, generation int) (*proc, error) {
	addr := s.replicas[k]
	dir := filepath.Join(st.dir, fmt.Sprintf("nginx-%s-%d-%d", s.name, k, generation))
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return nil, err
	}
	probe, err := freeAddr()
	if err != nil {
		return nil, err
	}
	file := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(file, []byte(nginxConfig(st.nginxUpstreams(s), addr, probe, dir, leastConn)), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc("nginx "+addr, nginxBinary, "-e", filepath.Join(dir, "error.log"), "-c", file)
	if err != nil {
		return nil, err
	}
	return p, waitTCP(p, probe, 10*time.Second)
}

// restartNginx replaces every nginx instance at once, as restartGateways
// replaces the gateways: the new one starts beside the old (reuseport),
// then the old one gets SIGQUIT, nginx's graceful stop (it closes its
// listeners and finishes what it holds).
func (st *stack) restartNginx(leastConn bool) error {
	var wg sync.WaitGroup
	errs := make([]error, len(st.nginx))
	i := 0
	for _, s := range st.sites {
		for k := range s.replicas {
			// Each goroutine touches only st.nginx[slot].
			slot := i
			i++
			wg.Go(func() {
				old := st.nginx[slot]
				p, err := st.launchNginx(s, k, leastConn, 1)
				if err != nil {
					errs[slot] = err
					return
				}
				st.nginx[slot] = p
				old.stopWith(syscall.SIGQUIT, 10*time.Second)
			})
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// close stops every process, gateways and nginx first, then the links.
func (st *stack) close() {
	defer func() {
		for _, p := range st.links {
			p.Close()
		}
	}()
	for _, p := range st.nginx {
		p.stop(5 * time.Second)
	}
	for _, s := range st.sites {
		for _, p := range s.gws {
			p.stop(5 * time.Second)
		}
	}
	for _, s := range st.sites {
		if s.op != nil {
			s.op.stop(5 * time.Second)
		}
		if s.simProc != nil {
			s.simProc.stop(5 * time.Second)
		}
	}
}

// nginxBinary is nginx from the OS packages.
var nginxBinary = "/usr/sbin/nginx"

var ErrNoNginx = errors.New("nginx is not installed: apt-get install nginx-light (the nginx routers need it)")

// waitHTTP waits until url answers 2xx, or p exits, or timeout.
func waitHTTP(p *proc, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	return waitFor(p, url, timeout, func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode/100 == 2
	})
}

// waitTCP waits until addr accepts a connection.
func waitTCP(p *proc, addr string, timeout time.Duration) error {
	return waitFor(p, addr, timeout, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func waitFor(p *proc, what string, timeout time.Duration, ok func() bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !ok() {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before %s answered: %s", p.name, what, lastLines(p.out.String(), 10))
		case <-ctx.Done():
			return fmt.Errorf("%s: %s did not answer within %v: %s", p.name, what, timeout, lastLines(p.out.String(), 10))
		case <-t.C:
		}
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := bytes.Split(bytes.TrimSpace([]byte(s)), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
