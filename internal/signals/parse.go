package signals

import (
	"math"
	"unicode/utf8"

	"github.com/grid-inference/grid/internal/signals/expo"
)

// Limits of the wire grammar (docs/protocol.md §2.2).
const (
	// MaxNameBytes bounds a metric name.
	MaxNameBytes = 256
	// MaxLabelValueBytes bounds grid_site and grid_provider values.
	MaxLabelValueBytes = 256
	// MaxLabels bounds one line's label pairs; the contract needs a handful.
	MaxLabels = 16
)

// Stamped is a parsed wire row with its timestamp.
type Stamped struct {
	Row
	StampMs int64
}

// Parse reads a /v1/site/signals body: `name{labels} value timestamp_ms`
// lines. Each line that satisfies the wire grammar and the store-level
// requirements (a `{` label set, a finite value, a timestamp, a name of at
// most 256 bytes, one grid_provider and at most one grid_site, each at most
// 256 bytes with no '/' and no control character) reaches fn; every other
// non-comment line counts as a parse drop. A body that is not UTF-8 is
// refused whole.
func Parse(body []byte, fn func(*Stamped)) (drops int, err error) {
	var st Stamped
	stats, err := expo.Scan(body, func([]byte) bool { return true }, func(s *expo.Sample) {
		if !s.HasLabelSet() || !s.HasTimestamp || len(s.Name) > MaxNameBytes ||
			math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			drops++
			return
		}
		st.Name = string(s.Name)
		st.Value = s.Value
		st.StampMs = s.Timestamp
		st.Labels = st.Labels[:0]
		sites, providers := 0, 0
		ok := true
		lerr := s.EachLabel(func(n, v []byte) bool {
			name := string(n)
			switch name {
			case LabelSite:
				sites++
				ok = ok && validTarget(v)
			case LabelProvider:
				providers++
				ok = ok && validTarget(v)
			}
			st.Labels = append(st.Labels, Label{Name: name, Value: string(v)})
			return ok && len(st.Labels) <= MaxLabels
		})
		if lerr != nil || !ok || providers != 1 || sites > 1 || len(st.Labels) > MaxLabels {
			drops++
			return
		}
		row := st
		row.Labels = append([]Label(nil), st.Labels...)
		fn(&row)
	})
	if err != nil {
		return 0, err
	}
	return drops + stats.Malformed, nil
}

// validTarget checks a grid_site or grid_provider value.
func validTarget(v []byte) bool {
	if len(v) == 0 || len(v) > MaxLabelValueBytes || !utf8.Valid(v) {
		return false
	}
	for _, c := range v {
		if c == '/' || c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}
