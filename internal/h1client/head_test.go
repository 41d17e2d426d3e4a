package h1client

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"reflect"
	"strings"
	"testing"
)

// answerSeeds are answers as engines and proxies send them, plain and odd.
var answerSeeds = []string{
	// vLLM (uvicorn): lowercase names, a Content-Length.
	"HTTP/1.1 200 OK\r\ndate: Sun, 06 Dec 2026 23:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 17\r\ncontent-type: application/json\r\n\r\n{\"id\":\"cmpl-1\"}\r\n",
	// A stream, chunked, then the next answer on the same connection.
	"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n7\r\n[DONE]\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Usage: 12\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Usage\r\n\r\n3\r\nabc\r\n0\r\nX-Usage: 12\r\n\r\n",
	"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
	"HTTP/1.1 503\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n",
	"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX-A:  padded \t\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
	// Shapes left to net/http.
	"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\n\r\nread to the end",
	"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1  200 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 2000 OK\r\nContent-Length: 1\r\n\r\nx",
}

// TestParseHeadTakesThePlainShape: the answers engines send are read by
// parseHead; the odd ones are left to net/http, and so read as before.
func TestParseHeadTakesThePlainShape(t *testing.T) {
	for _, tc := range []struct {
		answer string
		fast   bool
	}{
		{answerSeeds[0], true},
		{answerSeeds[1], true},
		{answerSeeds[2], true},
		{answerSeeds[3], false}, // trailers declared
		{answerSeeds[4], true},
		{answerSeeds[5], true},
		{answerSeeds[10], false}, // HTTP/1.0
		{answerSeeds[11], false}, // an interim answer
		{answerSeeds[13], false}, // a folded line
		{answerSeeds[14], false}, // bare LF
		{answerSeeds[19], false}, // read to the connection's end
	} {
		br := bufio.NewReader(strings.NewReader(tc.answer))
		br.Peek(1)
		before := br.Buffered()
		_, fast := parseHead(br, &http.Request{Method: http.MethodPost})
		if fast != tc.fast {
			t.Errorf("parseHead took %q: %v, want %v", tc.answer, fast, tc.fast)
		}
		if !fast && br.Buffered() != before {
			t.Errorf("parseHead left %q to net/http but read %d bytes of it", tc.answer, before-br.Buffered())
		}
	}
}

// FuzzParseHead holds parseHead to net/http.ReadResponse: wherever it takes
// an answer, the two read the same status, header, framing, body,
// trailers, and leave the same bytes on the connection for the next
// answer; where it does not, it has read nothing.
func FuzzParseHead(f *testing.F) {
	for _, s := range answerSeeds {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(answerSeeds[0]), true)
	f.Fuzz(func(t *testing.T, data []byte, head bool) {
		method := http.MethodPost
		if head {
			method = http.MethodHead
		}
		req := &http.Request{Method: method}
		fast := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		fast.Peek(1)
		before := fast.Buffered()
		got, ok := parseHead(fast, req)
		if !ok {
			if fast.Buffered() != before {
				t.Fatalf("left to net/http after reading %d bytes", before-fast.Buffered())
			}
			return
		}
		std := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		want, err := http.ReadResponse(std, req)
		if err != nil {
			t.Fatalf("parseHead took an answer net/http refuses (%v): %q", err, data)
		}
		for _, c := range []struct {
			what      string
			got, want any
		}{
			{"status", got.Status, want.Status},
			{"status code", got.StatusCode, want.StatusCode},
			{"protocol", []any{got.Proto, got.ProtoMajor, got.ProtoMinor}, []any{want.Proto, want.ProtoMajor, want.ProtoMinor}},
			{"header", got.Header, want.Header},
			{"content length", got.ContentLength, want.ContentLength},
			{"close", got.Close, want.Close},
			{"transfer encoding", got.TransferEncoding, want.TransferEncoding},
		} {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Fatalf("%s: parseHead %#v, net/http %#v, of %q", c.what, c.got, c.want, data)
			}
		}
		fb := &framedBody{br: fast, resp: got, remain: got.ContentLength}
		if got.ContentLength < 0 {
			fb.chunks = httputil.NewChunkedReader(fast)
		}
		gotBody, gotErr := io.ReadAll(fb)
		wantBody, wantErr := io.ReadAll(want.Body)
		if !bytes.Equal(gotBody, wantBody) || (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("body: parseHead %q (%v), net/http %q (%v), of %q", gotBody, gotErr, wantBody, wantErr, data)
		}
		if gotErr != nil {
			return // the connection is closed after a failed body
		}
		if !reflect.DeepEqual(got.Trailer, want.Trailer) {
			t.Fatalf("trailer: parseHead %v, net/http %v, of %q", got.Trailer, want.Trailer, data)
		}
		gotRest, _ := io.ReadAll(fast)
		wantRest, _ := io.ReadAll(std)
		if !bytes.Equal(gotRest, wantRest) {
			t.Fatalf("after the answer: parseHead left %q, net/http %q, of %q", gotRest, wantRest, data)
		}
	})
}

// BenchmarkReadHead reads a vLLM answer's head and body as the transport
// does: parseHead against net/http.ReadResponse.
func BenchmarkReadHead(b *testing.B) {
	answer := []byte(answerSeeds[0])
	req := &http.Request{Method: http.MethodPost}
	r := bytes.NewReader(answer)
	br := bufio.NewReaderSize(r, 4096)
	for _, bc := range []struct {
		name string
		read func() io.Reader
	}{
		{"parseHead", func() io.Reader {
			resp, ok := parseHead(br, req)
			if !ok {
				b.Fatal("not the plain shape")
			}
			return &framedBody{br: br, resp: resp, remain: resp.ContentLength}
		}},
		{"net-http", func() io.Reader {
			resp, err := http.ReadResponse(br, req)
			if err != nil {
				b.Fatal(err)
			}
			return resp.Body
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(answer)
				br.Reset(r)
				br.Peek(1)
				io.Copy(io.Discard, bc.read())
			}
		})
	}
}
