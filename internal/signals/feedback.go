package signals

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// The gateway rejection-report channel (docs/protocol.md §2.7, docs/signals.md).
const (
	// FeedbackPath is where a gateway reports skew evidence to its operator.
	FeedbackPath = "/v1/site/signals/feedback"
	// FeedbackEpochHeader and FeedbackSequenceHeader acknowledge a report.
	FeedbackEpochHeader    = "X-Grid-Feedback-Epoch"
	FeedbackSequenceHeader = "X-Grid-Feedback-Sequence"
	// MaxFeedbackBytes bounds a report body.
	MaxFeedbackBytes = 4 << 10
)

// Report observations.
const (
	ObservedBad   = "bad"
	ObservedClean = "clean"
)

// Report is one gateway rejection report.
type Report struct {
	// Epoch is the gateway process's random 128-bit epoch, in hex.
	Epoch string `json:"process_epoch"`
	// Sequence rises per report within the epoch (saturating).
	Sequence uint64 `json:"sequence"`
	// SkewTotal is the cumulative count of rows dropped for skew
	// (saturating).
	SkewTotal uint64 `json:"skew_dropped_total"`
	// Observed is "bad" when the cycle that produced the report dropped
	// rows for skew, "clean" otherwise.
	Observed string `json:"observed"`
}

// DecodeReport reads a report strictly: one JSON object, known fields only,
// a 32-hex-digit epoch, an observation of bad or clean.
func DecodeReport(body []byte) (Report, error) {
	var r Report
	if len(body) > MaxFeedbackBytes {
		return r, errors.New("report exceeds 4 KiB")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("report: %w", err)
	}
	if dec.More() {
		return r, errors.New("report: trailing data")
	}
	if b, err := hex.DecodeString(r.Epoch); err != nil || len(b) != 16 {
		return r, errors.New("report: process_epoch is not 32 hex digits")
	}
	if r.Observed != ObservedBad && r.Observed != ObservedClean {
		return r, fmt.Errorf("report: observed %q is not bad or clean", r.Observed)
	}
	return r, nil
}
