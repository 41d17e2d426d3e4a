package route

import (
	"testing"

	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/signals"
)

// TestStoppedUnitSeriesIsUnready: a pool whose per-endpoint series stopped
// while its ready count kept stamping has drained (its endpoints are gone,
// the EPP still counts them ready): it reads unready once the ready count
// has stamped a whole window past the last per-endpoint sample, and not
// before (docs/protocol.md §4.10).
func TestStoppedUnitSeriesIsUnready(t *testing.T) {
	const window = 5_000
	view := func(unitsUntil, until int64) *loadstore.View {
		v := &loadstore.View{Series: map[string][]loadstore.Sample{}}
		for at := int64(0); at <= until; at += 1_000 {
			v.Series[signals.EPPReadyEndpoints] = append(v.Series[signals.EPPReadyEndpoints], loadstore.Sample{At: at, Value: 2})
			v.Series[signals.EPPAverageRunning] = append(v.Series[signals.EPPAverageRunning], loadstore.Sample{At: at, Value: 1})
			v.Series[signals.EPPAverageQueue] = append(v.Series[signals.EPPAverageQueue], loadstore.Sample{At: at, Value: 0})
			if at <= unitsUntil {
				v.Series[signals.EPPPerEndpointQueue] = append(v.Series[signals.EPPPerEndpointQueue], loadstore.Sample{At: at, Value: 0})
			}
		}
		return v
	}
	for _, tc := range []struct {
		name              string
		unitsUntil, until int64
		unready           bool
	}{
		{"every series stamping", 20_000, 20_000, false},
		{"per-endpoint series a window behind", 14_000, 20_000, true},
		{"per-endpoint series late, within the window", 16_000, 20_000, false},
	} {
		r := Read(view(tc.unitsUntil, tc.until), tc.until, window, 1)
		if r.Unready != tc.unready {
			t.Errorf("%s: unready %v, want %v", tc.name, r.Unready, tc.unready)
		}
	}
}
