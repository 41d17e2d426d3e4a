package e2e

import (
	"bufio"
	"bytes"
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
)

// binDir holds the binaries the tests build, one per part, for this run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "grid-e2e-bin")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// A part is a program the tests run: its module directory (relative to
// this one), its package, and the binary's name.
type part struct {
	module, pkg, name string
}

var (
	gridPart = part{module: "..", pkg: "./cmd/grid", name: "grid"}
	simPart  = part{module: "parts/sim", pkg: "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim", name: "llm-d-inference-sim"}
	eppPart  = part{module: "parts/epp", pkg: "sigs.k8s.io/gateway-api-inference-extension/cmd/epp", name: "epp"}
	etcdPart = part{module: "parts/kube", pkg: "go.etcd.io/etcd/server/v3", name: "etcd"}
	apiPart  = part{module: "parts/kube", pkg: "k8s.io/kubernetes/cmd/kube-apiserver", name: "kube-apiserver"}
	helmPart = part{module: "parts/helm", pkg: "helm.sh/helm/v3/cmd/helm", name: "helm"}
	builds   sync.Map // part name → *build
)

type build struct {
	once sync.Once
	path string
	err  error
}

// binary builds p once per run (the Go build cache makes a rebuild cheap)
// and returns its path; a build that fails fails the test, never skips it.
func binary(t *testing.T, p part) string {
	t.Helper()
	v, _ := builds.LoadOrStore(p.name, &build{})
	b := v.(*build)
	b.once.Do(func() {
		b.path = filepath.Join(binDir, p.name)
		cmd := exec.Command("go", "build", "-C", p.module, "-o", b.path, p.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build %s: %v\n%s", p.name, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// portCursor walks the ports freePort hands out, below Linux's ephemeral
// range (32768 and up), so no outgoing connection takes a port between
// freePort's check and the child binding it.
var portCursor atomic.Int32

func init() { portCursor.Store(int32(30000 + os.Getpid()%250*10)) }

// freePort returns a loopback port nobody listens on, for a child to bind.
func freePort(t *testing.T) int {
	t.Helper()
	for range 1000 {
		port := portCursor.Add(1)
		if port >= 32700 {
			portCursor.CompareAndSwap(port, 30000)
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return int(port)
		}
	}
	t.Fatal("no free loopback port in 30000–32699")
	return 0
}

func addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

// process is a program running for a test; its output is kept and printed
// when the test fails.
type process struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

// run starts bin with args (and env added to the test's environment) and
// stops it with the test.
func run(t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{name: filepath.Base(bin), cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		io.Copy(io.Discard, pr)
	}()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			out := p.output()
			if len(out) > 20000 {
				out = "[…]\n" + out[len(out)-20000:]
			}
			t.Logf("output of %s %s:\n%s", p.name, strings.Join(args, " "), out)
		}
	})
	return p
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill sends SIGKILL and waits for the process to be reaped.
func (p *process) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits up to 20 s for the exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not exit within 20 s of SIGTERM", p.name)
	}
}

// eventually waits for cond, polling, and fails the test after timeout.
func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get returns the body of a plain GET, or "" on any failure.
func get(url string) string {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}

// metric returns the value of the first sample in exposition of the
// series name whose labels include every one of labels (each written
// key="value"), and whether there was one.
func metric(exposition, name string, labels ...string) (float64, bool) {
	for _, l := range strings.Split(exposition, "\n") {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			set := rest[1:end]
			matched := true
			for _, want := range labels {
				matched = matched && strings.Contains(set, want)
			}
			if !matched {
				continue
			}
			rest = rest[end+1:]
		} else if len(labels) > 0 {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(strings.TrimSpace(rest), &v); err == nil {
			return v, true
		}
	}
	return 0, false
}
