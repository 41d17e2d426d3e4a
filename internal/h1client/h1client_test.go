package h1client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func newTransport() *Transport {
	return &Transport{DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, MaxIdleConnsPerHost: 4}
}

// countingServer is an httptest server that counts the connections it
// accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s, &conns
}

// closeRecorder is a request body that remembers being closed.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

func post(t *testing.T, tr *Transport, ctx context.Context, url, body string) (*http.Response, *closeRecorder, error) {
	t.Helper()
	b := &closeRecorder{Reader: strings.NewReader(body)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, b)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	resp, err := tr.RoundTrip(req)
	return resp, b, err
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return string(b)
}

func TestKeptAliveConnectionIsReused(t *testing.T) {
	s, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "echo:"+string(b))
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for i := range 5 {
		resp, body, err := post(t, tr, context.Background(), s.URL+"/v1/chat/completions", `{"n":1}`)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := readAll(t, resp); got != `echo:{"n":1}` {
			t.Fatalf("request %d: answer %q", i, got)
		}
		if !body.closed.Load() {
			t.Errorf("request %d: the request body was not closed", i)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("5 sequential requests opened %d connections; want 1", n)
	}
}

// rawServer accepts connections and hands each to serve on its own
// goroutine.
func rawServer(t *testing.T, serve func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); serve(c) }()
		}
	}()
	return "http://" + ln.Addr().String()
}

func TestHeadAndBodyLeaveInOneWrite(t *testing.T) {
	first := make(chan string, 1)
	url := rawServer(t, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		n, _ := c.Read(buf)
		first <- string(buf[:n])
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 3000) + `"}]}`
	resp, _, err := post(t, tr, context.Background(), url+"/v1/chat/completions?a=b", body)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	got := <-first
	head, rest, ok := strings.Cut(got, "\r\n\r\n")
	if !ok || rest != body {
		t.Fatalf("the upstream's first read held %d bytes, not the head and the whole body:\n%.300s", len(got), got)
	}
	if !strings.HasPrefix(head, "POST /v1/chat/completions?a=b HTTP/1.1\r\nHost: ") || !strings.Contains(head, "\r\nContent-Length: "+strconv.Itoa(len(body))) {
		t.Errorf("head:\n%s", head)
	}
}

func TestClosedIdleConnectionIsReplacedAndTheRequestWrittenAgain(t *testing.T) {
	var conns atomic.Int32
	url := rawServer(t, func(c net.Conn) {
		conns.Add(1)
		r := bufio.NewReader(c)
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		// Keeps nothing alive, though it does not say so: the next
		// request on this connection finds it closed.
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for i := range 3 {
		resp, _, err := post(t, tr, context.Background(), url, `{"turn":1}`)
		if err != nil {
			t.Fatalf("request %d on a connection the server had closed: %v", i, err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("request %d: %q", i, got)
		}
	}
	if n := conns.Load(); n < 3 {
		t.Errorf("%d connections for 3 requests the server answered once each", n)
	}
}

func TestLargeBodyGoesOnAFreshConnectionAndAnEarlyAnswerIsRead(t *testing.T) {
	s, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 1<<20 {
			// Answers before reading: the body is refused.
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		io.WriteString(w, strings.Repeat("y", int(n%7)))
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	resp, _, err := post(t, tr, context.Background(), s.URL, "small")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	big := strings.Repeat("z", inlineBody+1)
	resp, body, err := post(t, tr, context.Background(), s.URL, big)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != strings.Repeat("y", len(big)%7) {
		t.Errorf("answer to a %d-byte body: %q", len(big), got)
	}
	if !body.closed.Load() {
		t.Error("the large body was not closed")
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("a large body after a small request used %d connections in all; want 2 (a fresh one)", n)
	}
	resp, body, err = post(t, tr, context.Background(), s.URL, strings.Repeat("z", 8<<20))
	if err != nil {
		t.Fatalf("a body the upstream refused before reading it: %v", err)
	}
	readAll(t, resp)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d; want the upstream's 413", resp.StatusCode)
	}
	if !body.closed.Load() {
		t.Error("the refused body was not closed")
	}
}

func TestResponseHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	s, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	defer close(release)
	tr := newTransport()
	tr.ResponseHeaderTimeout = 100 * time.Millisecond
	_, _, err := post(t, tr, context.Background(), s.URL, "x")
	if !errors.Is(err, ErrResponseHeaderTimeout) || !strings.Contains(err.Error(), "timeout awaiting response headers") {
		t.Fatalf("err = %v; want the response header timeout", err)
	}
}

func TestStreamIsReadAsItComesAndCancellingEndsIt(t *testing.T) {
	next := make(chan struct{})
	s, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		for range next {
			io.WriteString(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
		}
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	resp, _, err := post(t, tr, ctx, s.URL, "s")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for i := range 3 {
		next <- struct{}{}
		n, err := resp.Body.Read(buf)
		if err != nil || string(buf[:n]) != "data: {}\n\n" {
			t.Fatalf("event %d: %q, %v", i, buf[:n], err)
		}
	}
	cancel()
	if _, err := resp.Body.Read(buf); !errors.Is(err, context.Canceled) {
		t.Errorf("read after cancelling: %v; want context.Canceled", err)
	}
	resp.Body.Close()
	close(next)
	// The cancelled stream's connection is not reused.
	s.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	resp, _, err = post(t, tr, context.Background(), s.URL, "s")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections; want 2: a cancelled stream's is closed", n)
	}
}

func TestAnswerCutMidwayIsAnErrorNotAnEnd(t *testing.T) {
	for _, tc := range []struct{ name, answer string }{
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"},
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := rawServer(t, func(c net.Conn) {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				io.WriteString(c, tc.answer)
			})
			tr := newTransport()
			resp, _, err := post(t, tr, context.Background(), url, "x")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(got) != "hello" || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read %q, %v; want hello and io.ErrUnexpectedEOF", got, err)
			}
		})
	}
}

func TestInterimAnswersAreSkippedAndCloseIsHonoured(t *testing.T) {
	var conns atomic.Int32
	url := rawServer(t, func(c net.Conn) {
		conns.Add(1)
		r := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 4\r\n\r\ndone")
		}
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for range 2 {
		resp, _, err := post(t, tr, context.Background(), url, "x")
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, resp); resp.StatusCode != 200 || got != "done" {
			t.Fatalf("%d %q; want 200 done", resp.StatusCode, got)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections; want 2 (each answer said close)", n)
	}
}

func TestHeadCannotBeSplit(t *testing.T) {
	var seen http.Header
	s, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) { seen = r.Header.Clone() })
	tr := newTransport()
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, s.URL, bytes.NewReader([]byte("x")))
	req.Header.Set("User-Agent", "")
	req.Header.Set("X-Note", "a\tb")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if _, ok := seen["User-Agent"]; ok {
		t.Errorf("an empty User-Agent was sent as %q; want none", seen.Get("User-Agent"))
	}
	if got := seen.Get("X-Note"); got != "a\tb" {
		t.Errorf("X-Note arrived as %q", got)
	}
	for _, tc := range []struct {
		name string
		edit func(*http.Request)
		want string
	}{
		{"a header value with a line break", func(r *http.Request) { r.Header["X-Note"] = []string{"a\r\nX-Injected: yes"} }, "invalid value"},
		{"a header name with a space", func(r *http.Request) { r.Header["Bad Name"] = []string{"v"} }, "invalid header name"},
		{"a host with a line break", func(r *http.Request) { r.Host = "h\r\nX-Injected: yes" }, "invalid host"},
		{"a method with a space", func(r *http.Request) { r.Method = "GET /x" }, "invalid method"},
	} {
		body := &closeRecorder{Reader: strings.NewReader("x")}
		req, _ := http.NewRequest(http.MethodPost, s.URL, body)
		tc.edit(req)
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want refused (%s)", tc.name, err, tc.want)
		}
		if !body.closed.Load() {
			t.Errorf("%s: the refused request's body was not closed", tc.name)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections; want 1 (a refused request sends nothing)", n)
	}
}

// FuzzEncodeHead: whatever a request holds, its encoded head is refused
// or parses back to the same request line and headers, none added.
func FuzzEncodeHead(f *testing.F) {
	f.Add("POST", "127.0.0.1:8000", "/v1/chat/completions", "x=1", "X-Grid-Site", "east")
	f.Add("GET", "[::1]:80", "/a b/%zz", "", "Content-Type", "application/json; charset=utf-8")
	f.Add("POST", "h", "/", "", "X-Note", "a\r\nX-Injected: yes")
	f.Fuzz(func(t *testing.T, method, host, path, query, name, value string) {
		req := &http.Request{Method: method, URL: &url.URL{Scheme: "http", Host: host, Path: path, RawQuery: query},
			Header: http.Header{name: {value}}, Body: http.NoBody}
		head, _, err := encodeHead(nil, req)
		if err != nil {
			return
		}
		got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil {
			t.Fatalf("the encoded head does not parse: %v\n%q", err, head)
		}
		want := method
		if want == "" {
			want = http.MethodGet // as net/http reads an empty method
		}
		if got.Method != want || got.Host != host || got.RequestURI != req.URL.RequestURI() {
			t.Fatalf("%q %q %q came back as %q %q %q", want, host, req.URL.RequestURI(), got.Method, got.Host, got.RequestURI)
		}
		for k := range got.Header {
			if k != http.CanonicalHeaderKey(name) && k != "Content-Length" {
				t.Fatalf("header %q appeared from %q: %q", k, name, head)
			}
		}
	})
}

func TestRefusedConnectIsADialError(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, body, err := post(t, newTransport(), context.Background(), "http://"+addr, "x")
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("err = %v; want a dial *net.OpError", err)
	}
	if !body.closed.Load() {
		t.Error("the body of a request that never left was not closed")
	}
}

func TestIdleConnectionsExpire(t *testing.T) {
	s, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	tr := newTransport()
	tr.IdleConnTimeout = time.Nanosecond
	defer tr.CloseIdleConnections()
	for range 2 {
		resp, _, err := post(t, tr, context.Background(), s.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		time.Sleep(time.Millisecond) // past the idle timeout, not a wait for a condition
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections; want 2 (the first expired idle)", n)
	}
}

func TestAnswerHeadCutIsNotALostConnection(t *testing.T) {
	url := rawServer(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Ty")
	})
	_, _, err := post(t, newTransport(), context.Background(), url, "x")
	if err == nil || errors.Is(err, ErrConnectionLost) {
		t.Errorf("an answer cut in its head: %v; want an error other than ErrConnectionLost (the upstream had the request)", err)
	}
	url = rawServer(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
	})
	if _, _, err := post(t, newTransport(), context.Background(), url, "x"); !errors.Is(err, ErrConnectionLost) {
		t.Errorf("a connection closed with no answer: %v; want ErrConnectionLost", err)
	}
}

// TestRestartedServerCostsOneFailedWrite: a server that restarts closes
// every kept-alive connection at once. The first request after it finds
// one closed, drops the others and is written again on a fresh
// connection; no request fails for it.
func TestRestartedServerCostsOneFailedWrite(t *testing.T) {
	release := make(chan struct{})
	var held sync.WaitGroup
	s, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			held.Done()
			<-release
		}
		io.WriteString(w, "ok")
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	// Four concurrent requests leave four idle connections.
	held.Add(4)
	var done sync.WaitGroup
	for range 4 {
		done.Add(1)
		go func() {
			defer done.Done()
			req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
			req.Header.Set("X-Hold", "1")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	held.Wait()
	close(release)
	done.Wait()
	u, _ := url.Parse(s.URL)
	tr.mu.Lock()
	idle := len(tr.idle[u.Host])
	tr.mu.Unlock()
	if idle != 4 {
		t.Fatalf("%d idle connections; want 4", idle)
	}
	s.CloseClientConnections() // the restart
	before := conns.Load()
	for i := range 4 {
		resp, _, err := post(t, tr, context.Background(), s.URL, "x")
		if err != nil {
			t.Fatalf("request %d after the restart: %v", i, err)
		}
		readAll(t, resp)
	}
	if n := conns.Load() - before; n != 1 {
		t.Errorf("4 sequential requests after the restart opened %d connections; want 1", n)
	}
	tr.mu.Lock()
	idle = len(tr.idle[u.Host])
	tr.mu.Unlock()
	if idle != 1 {
		t.Errorf("%d idle connections after the restart; want the 1 fresh one", idle)
	}
}

// writeCounter counts the writes on the connections it dialled; it keeps
// the connection's descriptor reachable, as the probe needs.
type writeCounter struct {
	net.Conn
	writes *atomic.Int32
}

func (c writeCounter) Write(p []byte) (int, error) { c.writes.Add(1); return c.Conn.Write(p) }

func (c writeCounter) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// TestIdleConnectionClosedByItsServerIsNotWrittenOn: a connection idle
// past probeAfter that its server closed meanwhile (a keep-alive timeout)
// is found by the peek and replaced before any request is written on it.
func TestIdleConnectionClosedByItsServerIsNotWrittenOn(t *testing.T) {
	var closed atomic.Int32
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed.Add(1)
		}
	}
	s.Start()
	defer s.Close()
	var writes atomic.Int32
	dial := (&net.Dialer{Timeout: 2 * time.Second}).DialContext
	tr := &Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}}
	defer tr.CloseIdleConnections()
	resp, _, err := post(t, tr, context.Background(), s.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	u, _ := url.Parse(s.URL)
	tr.mu.Lock()
	tr.idle[u.Host][0].idleFrom = time.Now().Add(-2 * probeAfter)
	tr.mu.Unlock()
	s.CloseClientConnections()
	for closed.Load() == 0 {
		runtime.Gosched()
	}
	// The client's side has the server's FIN once the server's close
	// returned; the peek reads it.
	writes.Store(0)
	resp, _, err = post(t, tr, context.Background(), s.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := writes.Load(); n != 1 {
		t.Errorf("%d writes for one request after its idle connection was closed; want 1 (none on the closed one)", n)
	}
}

type failingBody struct{ closed atomic.Bool }

func (*failingBody) Read([]byte) (int, error) { return 0, errors.New("the client's body broke") }
func (b *failingBody) Close() error           { b.closed.Store(true); return nil }

// TestBodyThatFailsWhileTheAnswerComes: a large body whose reading fails
// while the upstream answers anyway: the answer is read whole, its end
// does not wait on the failed write, and the connection is not reused.
func TestBodyThatFailsWhileTheAnswerComes(t *testing.T) {
	var conns atomic.Int32
	url := rawServer(t, func(c net.Conn) {
		conns.Add(1)
		r := bufio.NewReader(c)
		if _, err := http.ReadRequest(r); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		io.Copy(io.Discard, r) // until the client closes
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for i := range 2 {
		body := &failingBody{}
		req, _ := http.NewRequest(http.MethodPost, url, body)
		req.ContentLength = inlineBody + 1
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("request %d: %q", i, got)
		}
		if !body.closed.Load() {
			t.Errorf("request %d: its body was not closed", i)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections; want 2 (a request whose body failed leaves its connection)", n)
	}
}
