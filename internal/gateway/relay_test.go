package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/grid-inference/grid/internal/sim"
)

// TestForwardHeader: what of a client's header goes upstream. Hop-by-hop
// fields stay on their connection (RFC 9110 §7.6.1), with those the
// client's Connection field names; a client's forwarding fields are
// replaced by the gateway's, a verified peer gateway's kept; trailers are
// accepted upstream only when the client accepts them; a client without a
// User-Agent is not given Go's.
func TestForwardHeader(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       http.Header
		tls      bool
		fromPeer bool
		remote   string
		want     http.Header
	}{
		{
			name:   "end-to-end fields pass, the gateway's forwarding fields are added",
			in:     http.Header{"Authorization": {"Bearer k"}, "Content-Type": {"application/json"}, "User-Agent": {"OpenAI/Python 1.0"}, "Accept": {"a", "b"}},
			remote: "10.0.0.7:51000",
			want: http.Header{"Authorization": {"Bearer k"}, "Content-Type": {"application/json"}, "User-Agent": {"OpenAI/Python 1.0"}, "Accept": {"a", "b"},
				"X-Forwarded-For": {"10.0.0.7"}, "X-Forwarded-Host": {"gw.example"}, "X-Forwarded-Proto": {"http"}},
		},
		{
			name: "hop-by-hop fields and those Connection names are dropped",
			in: http.Header{"Connection": {"keep-alive, X-Secret", "x-other"}, "Keep-Alive": {"timeout=5"}, "Proxy-Connection": {"keep-alive"},
				"Proxy-Authorization": {"Basic x"}, "Upgrade": {"websocket"}, "Trailer": {"X-T"}, "Transfer-Encoding": {"chunked"},
				"X-Secret": {"s"}, "X-Other": {"o"}, "X-Kept": {"k"}, "User-Agent": {"c"}},
			remote: "[::1]:443",
			tls:    true,
			want: http.Header{"X-Kept": {"k"}, "User-Agent": {"c"},
				"X-Forwarded-For": {"::1"}, "X-Forwarded-Host": {"gw.example"}, "X-Forwarded-Proto": {"https"}},
		},
		{
			name: "a client's forwarding fields are its word, replaced",
			in: http.Header{"Forwarded": {"for=1.2.3.4"}, "X-Forwarded-For": {"1.2.3.4"}, "X-Forwarded-Host": {"evil"},
				"X-Forwarded-Proto": {"https"}, "User-Agent": {"c"}},
			remote: "10.0.0.7:1",
			want:   http.Header{"User-Agent": {"c"}, "X-Forwarded-For": {"10.0.0.7"}, "X-Forwarded-Host": {"gw.example"}, "X-Forwarded-Proto": {"http"}},
		},
		{
			name: "a verified peer gateway's forwarding fields are its client's: kept, its address appended",
			in: http.Header{"Forwarded": {"for=1.2.3.4"}, "X-Forwarded-For": {"10.0.0.7"}, "X-Forwarded-Host": {"api.example"},
				"X-Forwarded-Proto": {"https"}, "User-Agent": {"c"}},
			remote:   "192.168.1.2:443",
			tls:      true,
			fromPeer: true,
			want:     http.Header{"User-Agent": {"c"}, "X-Forwarded-For": {"10.0.0.7, 192.168.1.2"}, "X-Forwarded-Host": {"api.example"}, "X-Forwarded-Proto": {"https"}},
		},
		{
			name:     "a peer gateway that sent none gets the gateway's",
			in:       http.Header{"User-Agent": {"c"}},
			remote:   "192.168.1.2:443",
			tls:      true,
			fromPeer: true,
			want:     http.Header{"User-Agent": {"c"}, "X-Forwarded-For": {"192.168.1.2"}, "X-Forwarded-Host": {"gw.example"}, "X-Forwarded-Proto": {"https"}},
		},
		{
			name:   "Te goes on as trailers only, when the client accepts them",
			in:     http.Header{"Te": {"gzip, Trailers;q=0.5"}, "User-Agent": {"c"}},
			remote: "10.0.0.7:1",
			want:   http.Header{"Te": {"trailers"}, "User-Agent": {"c"}, "X-Forwarded-For": {"10.0.0.7"}, "X-Forwarded-Host": {"gw.example"}, "X-Forwarded-Proto": {"http"}},
		},
		{
			name:   "Te without trailers, no User-Agent, an address that is not host:port",
			in:     http.Header{"Te": {"gzip"}},
			remote: "@",
			want:   http.Header{"User-Agent": {""}, "X-Forwarded-Host": {"gw.example"}, "X-Forwarded-Proto": {"http"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{Header: tc.in, Host: "gw.example", RemoteAddr: tc.remote}
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			before := tc.in.Clone()
			if got := forwardHeader(r, tc.fromPeer); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("forwarded\n%v\nwant\n%v", got, tc.want)
			}
			if !reflect.DeepEqual(tc.in, before) {
				t.Errorf("the client's header was changed: %v, was %v", tc.in, before)
			}
		})
	}
}

// TestDropHopHeaders: an answer's hop-by-hop fields, and those its
// Connection field names, do not reach the client.
func TestDropHopHeaders(t *testing.T) {
	h := http.Header{"Connection": {"close, X-Hop"}, "Keep-Alive": {"timeout=5"}, "Transfer-Encoding": {"chunked"}, "Trailer": {"X-T"},
		"X-Hop": {"h"}, "Content-Type": {"text/event-stream"}, "X-Request-Id": {"r"}}
	dropHopHeaders(h)
	if want := (http.Header{"Content-Type": {"text/event-stream"}, "X-Request-Id": {"r"}}); !reflect.DeepEqual(h, want) {
		t.Errorf("relayed %v, want %v", h, want)
	}
}

// TestUpstreamRequestURL: the request's path goes under the upstream's,
// one slash between them, its query after the upstream's; a query Go
// would read differently from the upstream is re-encoded from what
// parses.
func TestUpstreamRequestURL(t *testing.T) {
	for _, tc := range []struct{ base, req, want string }{
		{"http://10.0.0.1:8000", "/v1/chat/completions", "http://10.0.0.1:8000/v1/chat/completions"},
		{"http://10.0.0.1:8000/", "/v1/chat/completions", "http://10.0.0.1:8000/v1/chat/completions"},
		{"http://h/prefix", "/v1/completions", "http://h/prefix/v1/completions"},
		{"http://h/prefix/", "/v1/completions", "http://h/prefix/v1/completions"},
		{"https://peer:8443", "/v1/chat/completions?api-version=2024", "https://peer:8443/v1/chat/completions?api-version=2024"},
		{"http://h/p?key=1", "/v1/embeddings?x=2", "http://h/p/v1/embeddings?key=1&x=2"},
		{"http://h", "/v1/completions?a=1;b=2", "http://h/v1/completions"},
		{"http://h", "/v1/completions?a=1&b=%zz&c=3", "http://h/v1/completions?a=1&c=3"},
		{"http://h/a%2Fb", "/v1/x%2Fy", "http://h/a%2Fb/v1/x%2Fy"},
	} {
		base, _ := url.Parse(tc.base)
		in := httptest.NewRequest(http.MethodPost, tc.req, nil)
		ctx := context.WithValue(context.Background(), rejoinKey{}, "marker")
		out := upstreamRequest(ctx, in, base, false)
		if got := out.URL.String(); got != tc.want {
			t.Errorf("%s + %s: %s, want %s", tc.base, tc.req, got, tc.want)
		}
		if out.Method != http.MethodPost || out.Host != "" || out.RequestURI != "" || out.Context() != ctx {
			t.Errorf("%s + %s: method %q host %q request URI %q, context kept %v", tc.base, tc.req, out.Method, out.Host, out.RequestURI, out.Context() == ctx)
		}
	}
}

// TestRelayedHeadersEndToEnd: through a gateway and its provider, real
// connections both sides: the provider sees the client's end-to-end
// fields and the gateway's forwarding ones, not the client's hop-by-hop
// ones; the client sees the provider's end-to-end fields, the gateway's
// X-Grid-Site, and the provider's trailer, not its hop-by-hop fields.
func TestRelayedHeadersEndToEnd(t *testing.T) {
	seen := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Trailer", "X-Usage")
		w.Header().Set("Connection", "X-Provider-Hop")
		w.Header().Set("X-Provider-Hop", "hop")
		w.Header().Set("X-Request-Id", "req-1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"id":"x","choices":[]}`)
		w.Header().Set("X-Usage", "42")
	}))
	defer up.Close()
	g := benchGateway(t, up.URL)
	defer g.Close()
	gw := httptest.NewServer(g.ClientHandler())
	defer gw.Close()

	conn, err := net.Dial("tcp", gw.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"` + sim.DefaultModel + `","messages":[]}`
	io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw.example\r\nContent-Type: application/json\r\n"+
		"Authorization: Bearer k\r\nConnection: keep-alive, X-Client-Hop\r\nX-Client-Hop: h\r\nKeep-Alive: timeout=5\r\n"+
		"X-Forwarded-For: 6.6.6.6\r\nTe: trailers\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != `{"id":"x","choices":[]}` {
		t.Fatalf("status %d, body %q", resp.StatusCode, got)
	}
	h := <-seen
	for k, want := range map[string]string{"Authorization": "Bearer k", "Content-Type": "application/json", "X-Client-Hop": "",
		"Keep-Alive": "", "X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": "gw.example", "X-Forwarded-Proto": "http", "Te": "trailers", "User-Agent": ""} {
		if v := strings.Join(h[k], ","); v != want {
			t.Errorf("the provider saw %s %q, want %q", k, v, want)
		}
	}
	for k, want := range map[string]string{"X-Request-Id": "req-1", "X-Provider-Hop": "", "X-Grid-Site": "east", "Content-Type": "application/json"} {
		if v := resp.Header.Get(k); v != want {
			t.Errorf("the client saw %s %q, want %q", k, v, want)
		}
	}
	if v := resp.Trailer.Get("X-Usage"); v != "42" {
		t.Errorf("the client saw the trailer X-Usage %q, want 42 (trailers %v)", v, resp.Trailer)
	}
}
