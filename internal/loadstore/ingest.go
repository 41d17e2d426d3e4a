package loadstore

import (
	"hash/fnv"
	"math"

	"github.com/grid-inference/grid/internal/signals"
)

// Result counts what one ingest kept and refused.
type Result struct {
	Kept    int
	Refused signals.Tally
}

// Ingest stores the rows of a signals answer: the rows signals.Admit admits
// (docs/protocol.md §4.7) of the batches each key's fence admits
// (§4.9), within the store caps. dateMs is the answer's Date, nowMs the
// timeline now, wallMs the wall clock (for the epoch bound); origin says
// who answered.
func (s *Store) Ingest(body []byte, dateMs, nowMs, wallMs int64, origin signals.Origin) Result {
	var res Result
	groups, err := signals.Admit(body, dateMs, origin, &res.Refused)
	if err != nil {
		return res
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range groups {
		g := &groups[i]
		k := Key{g.Site, g.Provider}
		e := s.keys[k]
		if e == nil {
			if len(s.keys) >= MaxKeys || s.perSite[k.Site] >= MaxKeysPerSite {
				res.Refused.Add(signals.RefuseStoreCap, len(g.Rows))
				continue
			}
			e = &entry{series: map[string]*series{}, identityAt: math.MinInt64}
			s.keys[k] = e
			s.perSite[k.Site]++
		}
		if !e.admit(g, nowMs, wallMs, &res.Refused) {
			continue
		}
		for j := range g.Rows {
			e.push(&g.Rows[j], nowMs-g.Rows[j].AgeMs, s.windowMs)
			res.Kept++
		}
	}
	return res
}

// admit applies the batch fence and the learning gate to one key's rows
// (docs/protocol.md §4.9), at timeline instant nowMs. It reports whether the
// rows are stored.
func (e *entry) admit(g *signals.Group, nowMs, wallMs int64, refused *signals.Tally) bool {
	d, refusal, renewed := e.fence.Admit(g.Batch, wallMs)
	switch d {
	case signals.Refuse:
		refused.Add(refusal, len(g.Rows))
		return false
	case signals.Republish:
		return false // its age and learning lifetime stay the first's
	}
	if g.Batch == nil {
		e.learnable = false // missing metadata disables learning, not reading
		return true
	}
	if renewed {
		// A new identity: learned capacity starts over, and the samples of
		// the old one teach it nothing.
		e.generation++
		e.identityAt = nowMs
		for j := range g.Rows {
			e.identityAt = min(e.identityAt, nowMs-g.Rows[j].AgeMs)
		}
	}
	e.learnable = g.Batch.Samples > 0 && g.LoadSamples() == g.Batch.Samples
	return true
}

// push stores one admitted row at timeline instant at.
func (e *entry) push(row *signals.Aged, at, windowMs int64) {
	e.newestAt = max(e.newestAt, at)
	if row.Name == signals.Info {
		if m, _ := row.Label(signals.LabelModel); at >= e.infoAt {
			e.model, e.infoAt = m, at
			a, _ := row.Label(signals.LabelAdmission)
			var known bool
			if e.admission, known = signals.ParseAdmission(a); !known {
				// A value this gateway does not know (a newer peer's)
				// takes no new request: the conservative reading.
				e.admission = signals.AdmitExistingOnly
			}
		}
	}
	ser := e.series[row.Name]
	if ser == nil {
		if len(e.series) >= MaxMetricsPerKey {
			return // silently ignored, as the reference does
		}
		ser = &series{sum: row.Name == signals.EPPFlowControlQueue}
		e.series[row.Name] = ser
	}
	ser.push(at, row.Value, hashLabels(row.Labels), row.StampMs, windowMs)
}

// hashLabels is a stable 64-bit hash of a row's labels in line order, to
// tell apart the rows folded into one instant.
func hashLabels(ls []signals.Label) uint64 {
	h := fnv.New64a()
	for _, l := range ls {
		h.Write([]byte(l.Name))
		h.Write([]byte{0})
		h.Write([]byte(l.Value))
		h.Write([]byte{0})
	}
	return h.Sum64()
}
