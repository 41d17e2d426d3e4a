// Package h1client is an HTTP/1.1 client transport for upstreams spoken
// to in plain HTTP on a trusted network (a site's inference engines): each
// exchange runs on its caller's goroutine, a request's head and body leave
// in one write, and a kept-alive connection waits in its pool without a
// goroutine of its own.
//
// Why not net/http's Transport, which it replaces for that one job: per
// connection the standard transport keeps a read loop and a write loop
// goroutine (about 4 KiB of stack each for a stream's whole life), hands
// every request and answer between them and the caller, writes a
// request's head apart from a body it cannot tell is in memory, and reads
// once more after every answer to watch the idle connection. On a proxied
// chat completion that was a third of the proxy's system calls and its
// goroutine switches (BENCHMARKS.md, CPU per request).
//
// What it does not do: TLS, HTTP/2, proxies, upgrades, compression, or
// watching an idle connection. One idle for a second or more is peeked at
// before it is used again; one its server closed is otherwise found when
// it is next used. Either way every idle connection to that server is then
// closed, and a request whose whole body was written with its head is
// written again, once, on a fresh connection; a larger body is only ever
// sent on a fresh connection.
package h1client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrResponseHeaderTimeout is returned when an upstream has not begun its
// answer within ResponseHeaderTimeout of the request being written. Its
// text carries net/http's words for the same failure.
var ErrResponseHeaderTimeout = errors.New("h1client: timeout awaiting response headers")

// ErrConnectionLost is a connection that broke before any byte of its
// answer came: the request may never have reached the upstream, and no
// answer reached the caller.
var ErrConnectionLost = errors.New("h1client: connection lost before the answer")

// inlineBody is the largest body written in the same write as the
// request's head, and so the largest a request may have to be written
// again on a fresh connection.
const inlineBody = 64 << 10

// Transport is an http.RoundTripper over pooled HTTP/1.1 connections.
// Its exported fields are set before first use and not changed after.
type Transport struct {
	// DialContext opens a TCP connection; its errors are returned as
	// they are (a *net.OpError with Op "dial" for a refused or timed-out
	// connect).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// ResponseHeaderTimeout bounds the wait for an answer's head once the
	// request is written; 0 is no bound.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout is how long an idle connection is kept; 0 is 90 s.
	IdleConnTimeout time.Duration
	// MaxIdleConnsPerHost bounds the idle connections kept per address;
	// 0 is 2, as net/http's.
	MaxIdleConnsPerHost int
	// ReadBufferSize is each connection's read buffer; 0 is 4 KiB.
	ReadBufferSize int

	// mu guards idle, each address's idle connections, the most recently
	// used last; any goroutine.
	mu   sync.Mutex
	idle map[string][]*conn
}

// conn is one upstream connection. An exchange owns it from the pool's
// get until it is put back or closed.
type conn struct {
	nc       net.Conn
	br       *bufio.Reader
	addr     string
	idleFrom time.Time
	reused   bool
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// RoundTrip sends req and returns the head of its answer; the answer's
// body is read from the connection as the caller reads it, and the
// connection goes back to the pool when the body has been read to its end.
// req.Body is always closed, once it has been written.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || req.URL.Scheme != "http" {
		closeBody(req)
		return nil, fmt.Errorf("h1client: unsupported scheme in %v", req.URL)
	}
	ctx := req.Context()
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	bp := bufPool.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= inlineBody+4096 {
			*bp = (*bp)[:0]
			bufPool.Put(bp)
		}
	}()
	msg, inline, err := encodeHead((*bp)[:0], req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if inline {
		if msg, err = appendBody(msg, req); err != nil {
			return nil, fmt.Errorf("h1client: reading the request body: %w", err)
		}
	}
	*bp = msg
	for try := 0; ; try++ {
		c, err := t.get(ctx, addr, !inline || try > 0)
		if err != nil {
			if !inline {
				closeBody(req)
			}
			return nil, err
		}
		resp, err := t.exchange(ctx, c, req, msg, inline)
		if err == nil {
			return resp, nil
		}
		// A kept-alive connection its server had closed fails before any
		// answer; the request may not have reached the server at all. A
		// server that closed one may have restarted and closed them all:
		// the others go too, or each would fail a request in turn (and a
		// provider restarted after a failure be taken for down again).
		if errors.Is(err, ErrConnectionLost) && c.reused {
			t.closeIdle(addr)
			if inline && try == 0 && ctx.Err() == nil {
				continue
			}
		}
		return nil, err
	}
}

// exchange writes the request on c and reads its answer's head. On error,
// c is closed.
func (t *Transport) exchange(ctx context.Context, c *conn, req *http.Request, msg []byte, inline bool) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		stop()
		c.nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if t.ResponseHeaderTimeout > 0 {
		c.nc.SetReadDeadline(time.Now().Add(t.ResponseHeaderTimeout))
	}
	if _, err := c.nc.Write(msg); err != nil {
		if !inline {
			closeBody(req)
		}
		return fail(fmt.Errorf("%w: %w", ErrConnectionLost, err))
	}
	var wrote chan error // the body's write, when it follows the head
	if !inline {
		wrote = make(chan error, 1)
		go func() { wrote <- writeBody(c.nc, req) }()
	}
	// The first byte apart: a connection that ends before it lost the
	// request, one that ends after it broke an answer.
	_, err := c.br.Peek(1)
	lost := err != nil && isLost(err)
	var resp *http.Response
	if err == nil {
		resp, err = readHead(c.br, req)
	}
	if err != nil {
		if wrote != nil {
			c.nc.Close()
			<-wrote
		}
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil:
			err = ErrResponseHeaderTimeout
		case lost:
			err = fmt.Errorf("%w: %w", ErrConnectionLost, err)
		}
		return fail(err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if wrote != nil {
			c.nc.Close()
			<-wrote
		}
		return fail(errors.New("h1client: the upstream switched protocols, which is not supported"))
	}
	if t.ResponseHeaderTimeout > 0 {
		c.nc.SetReadDeadline(time.Time{})
		if ctx.Err() != nil { // cancelled between the head and the clearing
			c.nc.SetDeadline(time.Unix(1, 0))
		}
	}
	b := &body{t: t, c: c, ctx: ctx, rc: resp.Body, stop: stop, wrote: wrote, keep: !resp.Close}
	if resp.Body == nil { // framed by parseHead: its body reads off c
		b.framed = framedBody{br: c.br, resp: resp, remain: resp.ContentLength}
		if resp.ContentLength < 0 {
			b.framed.chunks = httputil.NewChunkedReader(c.br)
		}
		b.rc = &b.framed
	}
	if resp.Body == http.NoBody || resp.ContentLength == 0 {
		b.finish(b.keep) // nothing to read: the connection is free now
	}
	resp.Body = b
	return resp, nil
}

// readHead reads an answer's head, past any 1xx interim answer: one of the
// plain shape by parseHead (its Body left nil, for the caller to frame),
// any other by net/http.
func readHead(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if resp, ok := parseHead(br, req); ok {
		return resp, nil
	}
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
	}
}

func isLost(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// body is an answer's body, read off its connection. Read is called by
// one goroutine at a time; Close may come from another (a caller
// cancelling), so the connection's fate is decided under mu.
type body struct {
	t   *Transport
	c   *conn
	ctx context.Context
	rc  io.ReadCloser
	// framed is rc when parseHead read the head (one allocation for both).
	framed framedBody
	stop   func() bool
	wrote  chan error
	keep   bool

	mu   sync.Mutex
	done bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.finish(b.keep)
	case err != nil:
		b.finish(false)
		switch {
		case b.ctx.Err() != nil:
			err = b.ctx.Err() // not the deadline the cancellation set
		case errors.Is(err, io.EOF):
			err = io.ErrUnexpectedEOF
		}
	}
	return n, err
}

// Close ends the answer; one not read to its end closes its connection.
func (b *body) Close() error {
	b.finish(false)
	return nil
}

// finish gives the connection back to the pool when the answer was read
// whole, its request written whole, and no cancellation raced it;
// otherwise closes it. The first call decides.
func (b *body) finish(whole bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	stopped := b.stop()
	if b.wrote != nil {
		written := false
		if whole {
			select {
			case err := <-b.wrote:
				written, whole = true, err == nil
			default:
				whole = false // the upstream answered before it took the body
			}
		}
		if !whole {
			b.c.nc.Close()
			if !written {
				<-b.wrote // the write fails on the closed connection
			}
		}
	}
	if whole && stopped {
		b.t.put(b.c)
		return
	}
	b.c.nc.Close()
}

// probeAfter is how long a connection may sit idle before it is peeked at
// (closedByPeer) on its way out of the pool: one under load never is, and
// one a provider may have closed for idleness (uvicorn's keep-alive
// timeout is 5 s) or a restart is found before a request is written on it.
const probeAfter = time.Second

// get returns an idle connection to addr, or a new one; fresh asks for a
// new one.
func (t *Transport) get(ctx context.Context, addr string, fresh bool) (*conn, error) {
	if !fresh {
		if c := t.takeIdle(addr); c != nil {
			if time.Since(c.idleFrom) < probeAfter || !closedByPeer(c.nc) {
				return c, nil
			}
			// Closed while idle: so, likely, are the others (a restart).
			c.nc.Close()
			t.closeIdle(addr)
		}
	}
	nc, err := t.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	size := t.ReadBufferSize
	if size <= 0 {
		size = 4096
	}
	return &conn{nc: nc, br: bufio.NewReaderSize(nc, size), addr: addr}, nil
}

func (t *Transport) takeIdle(addr string) *conn {
	timeout := t.IdleConnTimeout
	if timeout <= 0 {
		timeout = 90 * time.Second
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	list := t.idle[addr]
	// The oldest are first: those idle too long go.
	stale := 0
	for stale < len(list) && now.Sub(list[stale].idleFrom) > timeout {
		list[stale].nc.Close()
		stale++
	}
	if stale > 0 {
		n := copy(list, list[stale:])
		clear(list[n:])
		list = list[:n]
		t.idle[addr] = list
	}
	if len(list) == 0 {
		return nil
	}
	c := list[len(list)-1]
	list[len(list)-1] = nil
	t.idle[addr] = list[:len(list)-1]
	c.reused = true
	return c
}

func (t *Transport) put(c *conn) {
	max := t.MaxIdleConnsPerHost
	if max <= 0 {
		max = 2
	}
	c.idleFrom = time.Now()
	c.nc.SetDeadline(time.Time{})
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.idle == nil {
		t.idle = map[string][]*conn{}
	}
	if len(t.idle[c.addr]) >= max {
		c.nc.Close()
		return
	}
	t.idle[c.addr] = append(t.idle[c.addr], c)
}

// CloseIdleConnections closes every idle connection; connections in use
// are closed when their answers end.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for addr, list := range t.idle {
		for _, c := range list {
			c.nc.Close()
		}
		delete(t.idle, addr)
	}
}

// closeIdle closes the idle connections to addr.
func (t *Transport) closeIdle(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.idle[addr] {
		c.nc.Close()
	}
	delete(t.idle, addr)
}

// encodeHead appends req's request line and header to buf, and reports
// whether its body is small and known enough to follow in the same write.
// A method, host, URI, header name or value that could split the head is
// refused, as net/http's transport refuses it.
func encodeHead(buf []byte, req *http.Request) ([]byte, bool, error) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !validHost(host) {
		return nil, false, fmt.Errorf("h1client: invalid host %q", host)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !validToken(method) {
		return nil, false, fmt.Errorf("h1client: invalid method %q", method)
	}
	uri := req.URL.RequestURI()
	if !strings.HasPrefix(uri, "/") || strings.ContainsFunc(uri, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, false, fmt.Errorf("h1client: invalid request URI %q", uri)
	}
	buf = append(buf, method...)
	buf = append(buf, ' ')
	buf = append(buf, uri...)
	buf = append(buf, " HTTP/1.1\r\nHost: "...)
	buf = append(buf, host...)
	buf = append(buf, "\r\n"...)
	hasBody := req.Body != nil && req.Body != http.NoBody
	length := req.ContentLength
	if !hasBody {
		length = 0
	}
	switch {
	case length < 0:
		buf = append(buf, "Transfer-Encoding: chunked\r\n"...)
	case length > 0 || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch:
		buf = append(buf, "Content-Length: "...)
		buf = strconv.AppendInt(buf, length, 10)
		buf = append(buf, "\r\n"...)
	}
	if req.Close {
		buf = append(buf, "Connection: close\r\n"...)
	}
	for name, values := range req.Header {
		if !validToken(name) {
			return nil, false, fmt.Errorf("h1client: invalid header name %q", name)
		}
		switch http.CanonicalHeaderKey(name) {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Trailer":
			continue
		}
		for _, v := range values {
			if v == "" && name == "User-Agent" {
				continue // net/http's way of asking for none
			}
			if !validHeaderValue(v) {
				return nil, false, fmt.Errorf("h1client: invalid value of header %q", name)
			}
			buf = append(buf, name...)
			buf = append(buf, ": "...)
			buf = append(buf, v...)
			buf = append(buf, "\r\n"...)
		}
	}
	buf = append(buf, "\r\n"...)
	return buf, length >= 0 && length <= inlineBody, nil
}

// appendBody appends req's whole body (ContentLength bytes) and closes it.
func appendBody(buf []byte, req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength == 0 {
		closeBody(req)
		return buf, nil
	}
	defer req.Body.Close()
	n := int(req.ContentLength)
	start := len(buf)
	if cap(buf)-start < n {
		grown := make([]byte, start, start+n)
		copy(grown, buf)
		buf = grown
	}
	buf = buf[:start+n]
	if _, err := io.ReadFull(req.Body, buf[start:]); err != nil {
		return nil, err
	}
	return buf, nil
}

// writeBody writes a body that did not fit the head's write, chunked when
// its length is unknown, then closes it.
func writeBody(w io.Writer, req *http.Request) error {
	defer req.Body.Close()
	if req.ContentLength < 0 {
		cw := httputil.NewChunkedWriter(w)
		if _, err := io.Copy(cw, req.Body); err != nil {
			return err
		}
		if err := cw.Close(); err != nil {
			return err
		}
		_, err := io.WriteString(w, "\r\n")
		return err
	}
	n, err := io.Copy(w, io.LimitReader(req.Body, req.ContentLength))
	if err == nil && n < req.ContentLength {
		err = fmt.Errorf("h1client: request body ended after %d of %d bytes", n, req.ContentLength)
	}
	return err
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// validHost reports whether s holds only the bytes a Host header may
// (RFC 3986's reg-name, IP literals and a port).
func validHost(s string) bool { return alnumOr(s, "!$%&'()*+,-.:;=[]_~") }

// validHeaderValue reports whether s has no control byte but tab: no line
// break can split the head (net/http's transport refuses the same).
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if !validValueByte(s[i]) {
			return false
		}
	}
	return true
}

// validValueByte reports whether c may be in a field value, written or
// read: visible, a space, a tab or any byte past ASCII.
func validValueByte(c byte) bool { return c >= ' ' && c != 0x7f || c == '\t' }

// tokenExtra is what an RFC 9110 token (a method, a field name) holds
// beside letters and digits.
const tokenExtra = "!#$%&'*+-.^_`|~"

// validToken reports whether s is an RFC 9110 token.
func validToken(s string) bool { return s != "" && alnumOr(s, tokenExtra) }

// validNameByte reports whether c may be in a field name.
func validNameByte(c byte) bool { return alnumOrByte(c, tokenExtra) }

// alnumOr reports whether every byte of s is a letter, a digit or one of
// extra.
func alnumOr(s, extra string) bool {
	for i := 0; i < len(s); i++ {
		if !alnumOrByte(s[i], extra) {
			return false
		}
	}
	return true
}

// alnumOrByte reports whether c is a letter, a digit or one of extra.
func alnumOrByte(c byte, extra string) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(extra, c) >= 0
}
