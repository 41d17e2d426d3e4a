package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/clock"
	"github.com/grid-inference/grid/internal/h1client"
	"github.com/grid-inference/grid/internal/route"
)

func TestPassiveHealth(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	var ejections []string
	h := newHealth(clk, func(r string) { ejections = append(ejections, r) })
	east := &route.Candidate{Site: "east", Provider: "pool", Local: true}
	west := &route.Candidate{Site: "west", Provider: "pool"}

	// Four 5xx in a row leave the upstream in; the fifth ejects it for 2s.
	for i := range 4 {
		h.answered(east, 500, clk.Now())
		if h.isDown(east) {
			t.Fatalf("ejected after %d 5xx answers", i+1)
		}
	}
	h.answered(east, 502, clk.Now())
	if !h.isDown(east) || len(ejections) != 1 || ejections[0] != eject5xx {
		t.Fatalf("five 5xx in a row: down %v, ejections %v", h.isDown(east), ejections)
	}
	clk.Advance(2 * time.Second)
	if h.isDown(east) {
		t.Error("still ejected after 2s")
	}
	// Five more double the period; an answer below 500 clears it all.
	for range 5 {
		h.answered(east, 503, clk.Now())
	}
	clk.Advance(3 * time.Second)
	if !h.isDown(east) {
		t.Error("the second ejection did not double to 4s")
	}
	h.answered(east, 200, clk.Now())
	if h.isDown(east) {
		t.Error("a good answer did not clear the ejection")
	}
	// A 5xx streak is broken by a good answer.
	for range 4 {
		h.answered(east, 500, clk.Now())
	}
	h.answered(east, 404, clk.Now())
	h.answered(east, 500, clk.Now())
	if h.isDown(east) {
		t.Error("ejected though the 5xx were not in a row")
	}
	// A refused connection ejects at once; other upstreams are unaffected.
	sent := clk.Now()
	clk.Advance(time.Millisecond)
	h.failed(west, sent)
	if !h.isDown(west) || h.isDown(east) || ejections[len(ejections)-1] != ejectRefused {
		t.Errorf("refused: west down %v, east down %v, ejections %v", h.isDown(west), h.isDown(east), ejections)
	}
	// Attempts sent with the first, refused after it, belong to its
	// ejection: they do not double the period.
	n := len(ejections)
	for range 7 {
		h.failed(west, sent)
	}
	if len(ejections) != n {
		t.Errorf("7 refusals of attempts sent before the ejection ejected %d times more", len(ejections)-n)
	}
	clk.Advance(2 * time.Second)
	if h.isDown(west) {
		t.Error("refusals of attempts sent before the ejection grew its period")
	}
	for range 10 {
		clk.Advance(time.Millisecond)
		h.failed(west, clk.Now())
	}
	clk.Advance(29 * time.Second)
	if !h.isDown(west) {
		t.Error("the period stopped growing before 30s")
	}
	clk.Advance(2 * time.Second)
	if h.isDown(west) {
		t.Error("the period grew past 30s")
	}
}

// TestClassifyUpstream: each way a round trip fails is told apart, and only
// those where nothing reached the upstream or came back may go elsewhere.
func TestClassifyUpstream(t *testing.T) {
	for _, tc := range []struct {
		err         error
		want        upstreamFailure
		nothingSent bool
	}{
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, upstreamRefused, true},
		{fmt.Errorf("proxy: %w", &net.OpError{Op: "dial", Err: timeoutError{}}), upstreamConnectTimeout, true},
		{errors.New("net/http: TLS handshake timeout"), upstreamTLS, true},
		{&tls.CertificateVerificationError{Err: errors.New("bad")}, upstreamTLS, true},
		{fmt.Errorf("modify: %w", errNotDelivered), upstreamNotDelivered, true},
		{errors.New("http2: client connection lost"), upstreamLost, true},
		{&net.OpError{Op: "read", Err: errHopSilent}, upstreamLost, true},
		{fmt.Errorf("hop 127.0.0.1:1: TLS handshake timeout: %w", context.DeadlineExceeded), upstreamTLS, true},
		{errors.New("net/http: timeout awaiting response headers"), upstreamResponse, false},
		{fmt.Errorf("provider: %w", h1client.ErrConnectionLost), upstreamLost, true},
		{fmt.Errorf("provider: %w", h1client.ErrResponseHeaderTimeout), upstreamResponse, false},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, upstreamTransport, false},
	} {
		got := classifyUpstream(tc.err)
		if got != tc.want || got.nothingSent() != tc.nothingSent {
			t.Errorf("%v: %s (nothing sent %v), want %s (%v)", tc.err, got, got.nothingSent(), tc.want, tc.nothingSent)
		}
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// TestEjectionCountsExactlyUnderConcurrency: requests in flight when an
// upstream is ejected fail after the ejection; their failures belong to the
// streak that ejected it and start no new one, so the next ejection takes
// five fresh failures, as documented.
func TestEjectionCountsExactlyUnderConcurrency(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	ejections := 0
	h := newHealth(clk, func(string) { ejections++ })
	east := &route.Candidate{Site: "east", Provider: "pool", Local: true}
	sent := clk.Now() // eight requests go out at once
	clk.Advance(time.Millisecond)
	for range 8 {
		h.answered(east, 500, sent)
	}
	if ejections != 1 {
		t.Fatalf("eight concurrent failures: %d ejections, want 1", ejections)
	}
	clk.Advance(2 * time.Second) // the ejection ends
	for i := range 4 {
		h.answered(east, 500, clk.Now())
		if h.isDown(east) {
			t.Fatalf("ejected again after %d fresh failures (the in-flight ones were counted twice)", i+1)
		}
	}
	h.answered(east, 500, clk.Now())
	if !h.isDown(east) || ejections != 2 {
		t.Errorf("the fifth fresh failure: down %v, %d ejections", h.isDown(east), ejections)
	}
}
