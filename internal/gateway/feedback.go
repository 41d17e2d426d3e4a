package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/signals"
)

// feedbackTimeout is the report exchange's own budget: a slow operator
// never makes a poll fail.
const feedbackTimeout = time.Second

// reporter holds the rejection-report state machine (docs/protocol.md §4.14). It
// lives as long as the process: poller and certificate reloads keep it.
type reporter struct {
	mu      sync.Mutex
	epoch   string
	seq     uint64
	cum     uint64
	pending *signals.Report
}

func newReporter() *reporter {
	var b [16]byte
	rand.Read(b[:])
	return &reporter{epoch: hex.EncodeToString(b[:])}
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// fold records one committed ingest's skew drops. New rejection supersedes
// whatever is pending; a clean cycle never replaces an unacknowledged bad
// report.
func (r *reporter) fold(skew int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cum = satAdd(r.cum, uint64(max(skew, 0)))
	if skew <= 0 && r.pending != nil && r.pending.Observed == signals.ObservedBad {
		return
	}
	r.seq = satAdd(r.seq, 1)
	observed := signals.ObservedClean
	if skew > 0 {
		observed = signals.ObservedBad
	}
	r.pending = &signals.Report{Epoch: r.epoch, Sequence: r.seq, SkewTotal: r.cum, Observed: observed}
}

// pendingBad reports whether an unacknowledged bad report waits.
func (r *reporter) pendingBad() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending != nil && r.pending.Observed == signals.ObservedBad
}

// deliver sends the pending report, if any. On a matching acknowledgement it
// clears the report only if it is still the pending one, so a late ack of an
// old clean report cannot clear newer bad evidence. It returns the failure
// reason, or "".
func (r *reporter) deliver(ctx context.Context, client *http.Client, url string) string {
	r.mu.Lock()
	if r.pending == nil {
		r.mu.Unlock()
		return ""
	}
	rep := *r.pending
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, feedbackTimeout)
	defer cancel()
	body, _ := json.Marshal(rep)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "transport"
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return "timeout"
		}
		return "transport"
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return "status"
	}
	epochs, seqs := resp.Header.Values(signals.FeedbackEpochHeader), resp.Header.Values(signals.FeedbackSequenceHeader)
	if len(epochs) != 1 || len(seqs) != 1 || epochs[0] != rep.Epoch || seqs[0] != strconv.FormatUint(rep.Sequence, 10) {
		return "acknowledgment"
	}
	r.mu.Lock()
	if r.pending != nil && r.pending.Sequence == rep.Sequence {
		r.pending = nil
	}
	r.mu.Unlock()
	return ""
}
