package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/signals"
)

// fakeOperator acknowledges reports the way a test tells it to.
type fakeOperator struct {
	mu     sync.Mutex
	got    []signals.Report
	status int
	ack    func(signals.Report, http.Header)
	delay  time.Duration
	// during runs after a report is read and before it is answered.
	during func(signals.Report)
}

func (f *fakeOperator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rep, err := signals.DecodeReport(body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	f.mu.Lock()
	f.got = append(f.got, rep)
	status, ack, delay, during := f.status, f.ack, f.delay, f.during
	f.mu.Unlock()
	if during != nil {
		during(rep)
	}
	time.Sleep(delay)
	if ack == nil {
		ack = func(rep signals.Report, h http.Header) {
			h.Set(signals.FeedbackEpochHeader, rep.Epoch)
			h.Set(signals.FeedbackSequenceHeader, strconv.FormatUint(rep.Sequence, 10))
		}
	}
	ack(rep, w.Header())
	if status == 0 {
		status = http.StatusNoContent
	}
	w.WriteHeader(status)
}

func TestReporterStateMachine(t *testing.T) {
	op := &fakeOperator{}
	srv := httptest.NewServer(op)
	defer srv.Close()
	r := newReporter()
	deliver := func() string { return r.deliver(context.Background(), srv.Client(), srv.URL) }

	// Nothing pending: nothing sent, nothing failed.
	if reason := deliver(); reason != "" || len(op.got) != 0 {
		t.Fatalf("empty delivery: %q %d", reason, len(op.got))
	}
	r.fold(0)
	if deliver() != "" || op.got[0].Observed != signals.ObservedClean || op.got[0].Sequence != 1 {
		t.Fatalf("clean report %+v", op.got)
	}
	// A bad report is kept until its exact ack; clean cycles cannot replace it.
	op.status = http.StatusInternalServerError
	r.fold(3)
	if reason := deliver(); reason != "status" {
		t.Fatalf("failed delivery reason %q", reason)
	}
	r.fold(0)
	r.fold(0)
	if !r.pendingBad() || r.pending.SkewTotal != 3 {
		t.Fatalf("clean cycles replaced bad evidence: %+v", r.pending)
	}
	// A mismatched acknowledgement does not clear it.
	op.status = 0
	op.ack = func(rep signals.Report, h http.Header) {
		h.Set(signals.FeedbackEpochHeader, rep.Epoch)
		h.Set(signals.FeedbackSequenceHeader, "999")
	}
	if reason := deliver(); reason != "acknowledgment" || !r.pendingBad() {
		t.Fatalf("mismatched ack: %q", reason)
	}
	// A repeated header is no acknowledgement either.
	op.ack = func(rep signals.Report, h http.Header) {
		h.Add(signals.FeedbackEpochHeader, rep.Epoch)
		h.Add(signals.FeedbackEpochHeader, rep.Epoch)
		h.Set(signals.FeedbackSequenceHeader, strconv.FormatUint(rep.Sequence, 10))
	}
	if reason := deliver(); reason != "acknowledgment" {
		t.Fatalf("repeated ack: %q", reason)
	}
	op.ack = nil
	if reason := deliver(); reason != "" || r.pending != nil {
		t.Fatalf("acknowledged bad not cleared: %q %+v", reason, r.pending)
	}
	// New rejection supersedes an unacknowledged clean report.
	r.fold(0)
	r.fold(2)
	if !r.pendingBad() || r.pending.SkewTotal != 5 {
		t.Fatalf("bad did not supersede clean: %+v", r.pending)
	}
	// Timeouts are their own reason.
	op.delay = 2 * feedbackTimeout
	if reason := deliver(); reason != "timeout" {
		t.Fatalf("slow operator: %q", reason)
	}
}

// TestReporterLateAckOfCleanKeepsNewerBad: the operator acknowledges a
// clean report after the gateway has folded newer bad evidence (while the
// clean one was in flight); that acknowledgment, matching the report it
// answers, does not clear the bad one, which is delivered next.
func TestReporterLateAckOfCleanKeepsNewerBad(t *testing.T) {
	r := newReporter()
	op := &fakeOperator{}
	op.during = func(rep signals.Report) {
		if rep.Observed == signals.ObservedClean {
			r.fold(4) // bad evidence arrives while the clean report is in flight
		}
	}
	srv := httptest.NewServer(op)
	defer srv.Close()
	r.fold(0) // clean, sequence 1
	if reason := r.deliver(context.Background(), srv.Client(), srv.URL); reason != "" {
		t.Fatalf("delivery of the clean report: %q", reason)
	}
	if !r.pendingBad() {
		t.Fatal("the late acknowledgment of an old clean report cleared newer bad evidence")
	}
	if reason := r.deliver(context.Background(), srv.Client(), srv.URL); reason != "" || r.pending != nil {
		t.Fatalf("the bad report: %q, pending %+v", reason, r.pending)
	}
	if len(op.got) != 2 || op.got[1].Observed != signals.ObservedBad || op.got[1].Sequence != 2 {
		t.Errorf("reports delivered %+v, want the clean one then the bad one", op.got)
	}
}

// TestReporterTransportFailure: an operator that cannot be reached is a
// transport failure, told apart from one that answers with a bad status.
func TestReporterTransportFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	r := newReporter()
	r.fold(2)
	if reason := r.deliver(context.Background(), http.DefaultClient, closed); reason != "transport" {
		t.Errorf("delivery to a closed port: reason %q, want transport", reason)
	}
	if !r.pendingBad() {
		t.Error("a failed delivery dropped the bad evidence")
	}
}

func TestReporterSaturates(t *testing.T) {
	r := newReporter()
	r.cum, r.seq = math.MaxUint64-1, math.MaxUint64-1
	r.fold(10)
	r.fold(10)
	if r.cum != math.MaxUint64 || r.seq != math.MaxUint64 {
		t.Errorf("counters wrapped: cum %d seq %d", r.cum, r.seq)
	}
	b, _ := json.Marshal(r.pending)
	if _, err := signals.DecodeReport(b); err != nil {
		t.Errorf("report at saturation does not decode: %v", err)
	}
}

func FuzzDecodeReport(f *testing.F) {
	f.Add([]byte(`{"process_epoch":"00112233445566778899aabbccddeeff","sequence":1,"skew_dropped_total":0,"observed":"clean"}`))
	f.Add([]byte(`{"process_epoch":"x"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rep, err := signals.DecodeReport(body)
		if err == nil && rep.Observed != signals.ObservedBad && rep.Observed != signals.ObservedClean {
			t.Fatalf("accepted %+v", rep)
		}
	})
}

// TestFailedPollStillDeliversBadEvidence: bad evidence waiting for its
// acknowledgment is retried after a poll that failed (the operator's relay
// answered 500) as after a good one: the operator must hear of skew drops
// even while its relay fails, and the report is cleared once acknowledged.
func TestFailedPollStillDeliversBadEvidence(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g, id := newTestGateway(t, "https://"+ln.Addr().String())
	defer g.Close()
	op := &fakeOperator{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == signals.FeedbackPath {
			op.ServeHTTP(w, r)
			return
		}
		http.Error(w, "relay broken", http.StatusInternalServerError)
	}), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, id.ServerTLS()))
	defer srv.Close()

	g.rep.fold(3) // skew drops an earlier poll saw, not yet acknowledged
	if g.Poll(context.Background()) {
		t.Fatal("the poll of a relay answering 500 succeeded")
	}
	op.mu.Lock()
	got := op.got
	op.mu.Unlock()
	if len(got) != 1 || got[0].Observed != signals.ObservedBad || got[0].SkewTotal != 3 {
		t.Fatalf("reports delivered after the failed poll: %+v, want the bad one", got)
	}
	if g.rep.pendingBad() {
		t.Error("the acknowledged bad report is still pending")
	}
}

// TestPollsKeepAConnectionUntilTrustMoves: the polls of the operator
// share one TLS connection, verified at its handshake (docs/protocol.md
// §4.1); a renewal of this site's certificate material, or a failed poll,
// makes the next poll dial and verify afresh.
func TestPollsKeepAConnectionUntilTrustMoves(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	g, id := newTestGatewayIn(t, dir, "https://"+ln.Addr().String())
	defer g.Close()
	var conns, requests atomic.Int64
	var failNext atomic.Bool
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path == signals.ServingPath {
			json.NewEncoder(w).Encode(signals.Serving{Site: "east"})
			return
		}
		if failNext.CompareAndSwap(true, false) {
			// An answer read whole that fails the poll: no Date, so its
			// rows cannot be aged. The connection itself is sound.
			w.Header()["Date"] = nil
			return
		}
		w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}), ErrorLog: log.New(io.Discard, "", 0), ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}}
	go srv.Serve(tls.NewListener(ln, id.ServerTLS()))
	defer srv.Close()
	poll := func(want bool) {
		t.Helper()
		if got := g.Poll(context.Background()); got != want {
			t.Fatalf("poll succeeded: %v, want %v", got, want)
		}
	}
	for range 3 {
		poll(true)
	}
	// Each poll reads the relay and the serving document and sends its
	// report.
	if n, r := conns.Load(), requests.Load(); n != 1 || r < 6 {
		t.Fatalf("3 polls sent %d requests on %d connections, want one connection", r, n)
	}

	if err := identity.Issue(dir, "east", nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if changed, err := id.Reload(); err != nil || !changed {
		t.Fatalf("reload of the renewed certificate: %v, %v", changed, err)
	}
	poll(true)
	poll(true)
	if n := conns.Load(); n != 2 {
		t.Fatalf("after a renewal the polls used %d connections in all, want 2: the one made under the old material is not reused", n)
	}

	failNext.Store(true)
	poll(false)
	poll(true)
	if n := conns.Load(); n != 3 {
		t.Errorf("after a failed poll the polls used %d connections in all, want 3: the next poll dials afresh", n)
	}
}
