package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
)

// Relaying one attempt: the request as it leaves for the upstream, and the
// answer as it goes back to the client. The gateway does this itself
// rather than through httputil.ReverseProxy: the proxy was built per
// attempt, cloned the whole request, put a 1xx trace in the upstream
// request's context, parsed the answer's media type and started a timer
// goroutine to flush a stream's head, none of which an OpenAI API request
// needs (BENCHMARKS.md, CPU per request). The rules are the proxy's
// (RFC 9110 §7.6.1 hop-by-hop fields, X-Forwarded-*), but that a verified
// peer gateway's forwarding fields are kept; they are tested in
// relay_test.go. It does not relay 1xx answers or protocol upgrades, which
// no OpenAI API request asks for (docs/gateway.md).

// hopHeader reports whether name (canonical) is a field of one connection,
// never forwarded: the fields RFC 9110 §7.6.1 names, those of older HTTP
// (Keep-Alive, Proxy-Connection), and Te, which is sent on only as
// "trailers".
func hopHeader(name string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// forwardedHeader reports whether name is a forwarding field the client
// may have set; the gateway writes its own (forwardHeader).
func forwardedHeader(name string) bool {
	switch name {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return false
}

// Shared values of the fields forwardHeader adds. Transports only read a
// request's header, and a value set later replaces the slice, so one
// slice serves every request.
var (
	teTrailers  = []string{"trailers"}
	protoHTTP   = []string{"http"}
	protoHTTPS  = []string{"https"}
	noUserAgent = []string{""}
)

// forwardExtra is how many fields forwardHeader may add to the client's.
const forwardExtra = 5

// forwardHeader is the header r goes upstream with: r's end-to-end fields
// (not the hop-by-hop ones, nor those its Connection field names), "Te:
// trailers" when the client accepts trailers, and X-Forwarded-For (the
// client's address), X-Forwarded-Host and X-Forwarded-Proto. A client's
// own forwarding fields are dropped (an upstream must not trust them);
// those of a peer gateway whose certificate the hop verified (fromPeer)
// are its word about its own client, as its board is its word about its
// load: kept, its address appended to X-Forwarded-For, so a provider
// behind the exit gateway sees the client that entered the grid. A client
// that sent no User-Agent is forwarded without one, not with Go's. The
// values are r's own slices, not copies: nothing writes into them.
func forwardHeader(r *http.Request, fromPeer bool) http.Header {
	in := r.Header
	h := make(http.Header, len(in)+forwardExtra)
	for k, vv := range in {
		if !hopHeader(k) && (!forwardedHeader(k) || fromPeer && k != "Forwarded") {
			h[k] = vv
		}
	}
	dropNamedByConnection(h, in)
	if hasToken(in["Te"], "trailers") {
		h["Te"] = teTrailers
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := h["X-Forwarded-For"]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h["X-Forwarded-For"] = []string{ip}
	}
	if h["X-Forwarded-Host"] == nil {
		h["X-Forwarded-Host"] = []string{r.Host}
	}
	if h["X-Forwarded-Proto"] == nil {
		h["X-Forwarded-Proto"] = protoHTTP
		if r.TLS != nil {
			h["X-Forwarded-Proto"] = protoHTTPS
		}
	}
	if _, ok := in["User-Agent"]; !ok {
		h["User-Agent"] = noUserAgent
	}
	return h
}

// dropHopHeaders removes an answer's hop-by-hop fields before it is
// relayed to the client.
func dropHopHeaders(h http.Header) {
	dropNamedByConnection(h, h)
	for k := range h {
		if hopHeader(k) {
			delete(h, k)
		}
	}
}

// dropNamedByConnection removes from h every field that from's Connection
// field names (RFC 9110 §7.6.1).
func dropNamedByConnection(h, from http.Header) {
	for _, v := range from["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				delete(h, textproto.CanonicalMIMEHeaderKey(name))
			}
		}
	}
}

// hasToken reports whether the comma-separated values hold token (case
// insensitive), with or without parameters.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			t, _, _ = strings.Cut(t, ";")
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// upstreamRequest is the request an attempt sends to the upstream at base,
// on ctx: r's method, its path under base's, its query after base's (a
// query the upstream could split differently from Go, with a ';' or a bad
// escape, is sent re-encoded from what parses), and forwardHeader's
// header (fromPeer: r came over the hop from a verified peer gateway). Its
// Host is base's. The caller sets the body.
func upstreamRequest(ctx context.Context, r *http.Request, base *url.URL, fromPeer bool) *http.Request {
	u := &url.URL{Scheme: base.Scheme, Host: base.Host, RawQuery: base.RawQuery}
	u.Path, u.RawPath = joinPath(base, r.URL)
	if q := cleanQuery(r.URL.RawQuery); q != "" {
		if u.RawQuery != "" {
			u.RawQuery += "&"
		}
		u.RawQuery += q
	}
	out := &http.Request{Method: r.Method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: forwardHeader(r, fromPeer)}
	return out.WithContext(ctx)
}

// joinPath is the request's path under base's, one slash between them; a
// raw (escaped) form is kept where either has one.
func joinPath(base, req *url.URL) (path, rawPath string) {
	if base.Path == "" && base.RawPath == "" {
		return req.Path, req.RawPath
	}
	path = joinSlash(base.Path, req.Path)
	if base.RawPath == "" && req.RawPath == "" {
		return path, ""
	}
	return path, joinSlash(base.EscapedPath(), req.EscapedPath())
}

func joinSlash(a, b string) string {
	switch as, bs := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/"); {
	case as && bs:
		return a + b[1:]
	case !as && !bs:
		return a + "/" + b
	}
	return a + b
}

// cleanQuery is q as it is forwarded: unchanged when it parses, else
// re-encoded from the pairs that do (a ';' separator or a bad escape
// would let the upstream read parameters the gateway did not).
func cleanQuery(q string) string {
	if q == "" {
		return ""
	}
	v, err := url.ParseQuery(q)
	if err == nil {
		return q
	}
	return v.Encode()
}

// relayAnswer writes resp to the client through w: its end-to-end header
// fields and status, then its body, each read written at once, and flushed
// at once for an event stream (stream) or an answer of unknown length, so
// a stream passes through unbuffered (its head is flushed before its first
// event); an answer of known length goes out whole, head and body in one
// write (a flush per write cost a quarter of a JSON request's CPU). A body
// that cannot be copied to its end (the upstream broke it, or the client
// left) aborts the handler (http.ErrAbortHandler), so the server cuts the
// answer rather than end it cleanly. Trailers follow the body.
func relayAnswer(w *trackingWriter, resp *http.Response, stream bool) {
	flush := relayHead(w, resp, stream)
	pool := &bulkBuffers
	if stream {
		pool = &streamBuffers
	}
	buf := pool.Get().(*[]byte)
	defer pool.Put(buf)
	relayBody(w, resp, flush, *buf)
}

// relayHead writes resp's end-to-end header fields and status to the
// client through w, flushed at once for a stream or an answer of unknown
// length; it says whether the body's writes are to be flushed too.
func relayHead(w *trackingWriter, resp *http.Response, stream bool) (flush bool) {
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	w.WriteHeader(resp.StatusCode)
	flush = stream || resp.ContentLength < 0
	if flush {
		w.Flush()
	}
	return flush
}

// relayBody copies resp's body through buf, then its trailers, to the
// client through w, as relayAnswer says; it panics with
// http.ErrAbortHandler when the body cannot be copied to its end.
func relayBody(w *trackingWriter, resp *http.Response, flush bool, buf []byte) {
	if err := copyBody(w, resp.Body, buf, flush); err != nil {
		resp.Body.Close()
		panic(http.ErrAbortHandler)
	}
	resp.Body.Close() // the transport fills resp.Trailer at the body's end
	if len(resp.Trailer) > 0 {
		w.Flush() // sent chunked, so the trailers can follow
		h := w.Header()
		for k, vv := range resp.Trailer {
			for _, v := range vv {
				h.Add(http.TrailerPrefix+k, v)
			}
		}
	}
}

// copyBody copies body to w one read at a time, each read written at once
// and, with flush, flushed at once; it returns the first error reading or
// writing, nil at the body's end.
func copyBody(w http.ResponseWriter, body io.Reader, buf []byte, flush bool) error {
	f, _ := w.(http.Flusher)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if flush && f != nil {
				f.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
