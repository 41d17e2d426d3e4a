package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestRefusedStreamIsSentAgain: an HTTP/2 upstream that refuses a stream
// (RST_STREAM REFUSED_STREAM, as a stream opened after a peer gateway's
// graceful-shutdown GOAWAY is refused) has not processed it, and the
// transport sends the request again, whole, on the next stream; the body
// budget is held until the last attempt lets go. Without GetBody the
// transport could not read a written body again and the client got a
// 502: one of the 684 requests of three rolling restarts in grid bench
// sites.
func TestRefusedStreamIsSentAgain(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	received := make(chan int, 4) // each stream's body length
	go refuseFirstStream(t, ln, received)

	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	budget := newBodyBudget(1 << 20)
	body := bytes.Repeat([]byte("x"), 40_000) // more than one DATA frame
	if !budget.reserve(int64(len(body))) {
		t.Fatal("the budget refused the body")
	}
	out := &outbound{body: body, held: budget.hold(int64(len(body)))}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions", nil)
	if err != nil {
		t.Fatal(err)
	}
	out.setBody(req)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("a request whose stream was refused: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d", resp.StatusCode)
	}
	if first, second := <-received, <-received; first != len(body) || second != len(body) {
		t.Errorf("the upstream read bodies of %d and %d bytes, want %d twice", first, second, len(body))
	}
	out.held.letGo() // the handler's own hold
	if used := budget.used.Load(); used != 0 {
		t.Errorf("%d bytes still held against the budget after both attempts", used)
	}
}

// refuseFirstStream serves one HTTP/2 connection on ln without TLS: it
// reads each stream's request whole, refuses the first and answers the
// next 200, sending each body's length on received.
func refuseFirstStream(t *testing.T, ln net.Listener, received chan<- int) {
	c, err := ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	br := bufio.NewReader(c)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, preface); err != nil || string(preface) != http2.ClientPreface {
		t.Errorf("no HTTP/2 preface: %q, %v", preface, err)
		return
	}
	fr := http2.NewFramer(c, br)
	fr.WriteSettings()
	var head bytes.Buffer
	enc := hpack.NewEncoder(&head)
	lengths := map[uint32]int{}
	streams := 0
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			lengths[f.StreamID] = 0
		case *http2.DataFrame:
			id := f.StreamID
			lengths[id] += len(f.Data())
			if n := uint32(len(f.Data())); n > 0 {
				fr.WriteWindowUpdate(0, n)
				fr.WriteWindowUpdate(id, n)
			}
			if !f.StreamEnded() {
				continue
			}
			received <- lengths[id]
			streams++
			if streams == 1 {
				fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
				continue
			}
			head.Reset()
			enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			enc.WriteField(hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(2)})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: head.Bytes(), EndHeaders: true})
			fr.WriteData(id, true, []byte("{}"))
		}
	}
}
