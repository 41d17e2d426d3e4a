package h1client

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkRoundTrip is one small chat completion's exchange, request
// written and answer read whole, on a kept-alive loopback connection: this
// client against net/http's transport as the gateway configured it before
// (512-byte write and 1 KiB read buffers). The server shares the process,
// so ns/op holds both sides; allocations are the client's and the
// server's alike.
func BenchmarkRoundTrip(b *testing.B) {
	answer := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"}}]}`)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	}))
	defer s.Close()
	body := []byte(`{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`)
	dial := (&net.Dialer{Timeout: time.Second}).DialContext
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"h1client", &Transport{DialContext: dial, ReadBufferSize: 1 << 10}},
		{"net-http", &http.Transport{DialContext: dial, WriteBufferSize: 512, ReadBufferSize: 1 << 10}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			buf := make([]byte, 4096)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := tc.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				for {
					if _, err := resp.Body.Read(buf); err != nil {
						break
					}
				}
				resp.Body.Close()
			}
		})
	}
}
