package gateway

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/signals"
)

// fakeOperator acknowledges reports the way a test tells it to.
type fakeOperator struct {
	mu     sync.Mutex
	got    []signals.Report
	status int
	ack    func(signals.Report, http.Header)
	delay  time.Duration
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
	status, ack, delay := f.status, f.ack, f.delay
	f.mu.Unlock()
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

func TestReporterLateAckOfCleanKeepsNewerBad(t *testing.T) {
	r := newReporter()
	r.fold(0) // clean, seq 1
	clean := *r.pending
	r.fold(4) // bad, seq 2
	// The ack of the clean report arrives now: it must not clear the bad.
	r.mu.Lock()
	if r.pending != nil && r.pending.Sequence == clean.Sequence {
		r.pending = nil
	}
	r.mu.Unlock()
	if !r.pendingBad() {
		t.Fatal("a late ack of an old clean report cleared newer bad evidence")
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
