package signals

import (
	"math"
	"strconv"
)

// Bounds on what one site may publish (docs/protocol.md §3.2).
const (
	MaxPeerProviders = 64
	// AgeAheadTolerance is how far past its Date a stamp may be: the Date
	// header's one-second resolution.
	AgeAheadTolerance = 1000
	// MaxAgeMs is the oldest a relayed row may be.
	MaxAgeMs = 86_400_000
	// EpochAheadMs is how far ahead of the receiver's wall clock a publisher
	// epoch may be (SWIM's lease bound).
	EpochAheadMs = 600_000
)

// Check applies the per-row contract bounds: a contract name, a DNS-1123
// grid_provider, a finite non-negative value, at most 1 for the ready flag
// and the error ratio, a model name on an info line. It returns the refusal
// and true when the row breaks one.
func Check(r *Row) (Refusal, bool) {
	if !IsContract(r.Name) {
		return RefuseName, true
	}
	if p, _ := r.Label(LabelProvider); !IsDNS1123Label(p) {
		return RefuseProvider, true
	}
	if math.IsNaN(r.Value) || math.IsInf(r.Value, 0) || r.Value < 0 {
		return RefuseValue, true
	}
	if (r.Name == Ready || r.Name == ErrorRatio) && r.Value > 1 {
		return RefuseValue, true
	}
	if r.Name == Info {
		if m, _ := r.Label(LabelModel); !validModel(m) {
			return RefuseValue, true
		}
	}
	return 0, false
}

// AgeMs returns a row's age against the response's Date, and whether it is
// admissible: no more than 1s past the Date (its resolution), no more than a
// day before it.
func AgeMs(dateMs, stampMs int64) (int64, bool) {
	age := dateMs - stampMs
	if age < -AgeAheadTolerance || age > MaxAgeMs {
		return age, false
	}
	return max(age, 0), true
}

// Batch is a parsed grid_provider_config_generation line.
type Batch struct {
	UID        string
	Epoch      int64
	Sequence   int64
	Samples    int64
	Generation float64
}

// ParseBatch reads a batch metadata row; ok is false when a label is missing
// or not a number.
func ParseBatch(r *Row) (b Batch, ok bool) {
	if r.Name != ConfigGeneration {
		return b, false
	}
	b.Generation = r.Value
	var err error
	num := func(name string) int64 {
		v, _ := r.Label(name)
		n, e := strconv.ParseInt(v, 10, 64)
		if e != nil || n < 0 {
			err = e
			if err == nil {
				err = strconv.ErrRange
			}
		}
		return n
	}
	b.UID, _ = r.Label("provider_uid")
	b.Epoch = num("publisher_epoch")
	b.Sequence = num("batch_sequence")
	b.Samples = num("batch_samples")
	return b, err == nil && b.UID != ""
}

// Before reports whether b was published before o by the same publisher
// ordering: (epoch, sequence).
func (b Batch) Before(o Batch) bool {
	return b.Epoch < o.Epoch || (b.Epoch == o.Epoch && b.Sequence < o.Sequence)
}

// Same reports whether b and o are the same publication.
func (b Batch) Same(o Batch) bool { return b.Epoch == o.Epoch && b.Sequence == o.Sequence }

// validModel accepts a model name: 1 to 256 bytes without control characters
// ('/' is common in model names, as in Qwen/Qwen3-8B).
func validModel(m string) bool {
	if m == "" || len(m) > MaxLabelValueBytes {
		return false
	}
	for i := 0; i < len(m); i++ {
		if m[i] < 0x20 || m[i] == 0x7f {
			return false
		}
	}
	return true
}
