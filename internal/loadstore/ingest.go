package loadstore

import (
	"hash/fnv"

	"github.com/grid-inference/grid/internal/signals"
)

// Drop reasons of grid_signals_ingest_dropped_total.
const (
	DropSkew         = "skew"
	DropSiteMismatch = "site_mismatch"
	DropCap          = "cap"
	DropParse        = "parse"
	DropName         = "name"
	DropProvider     = "provider"
	DropValue        = "value"
	DropDelayed      = "delayed"
)

// DropReasons lists every reason, for pre-created counters.
var DropReasons = []string{DropSkew, DropSiteMismatch, DropCap, DropParse, DropName, DropProvider, DropValue, DropDelayed}

// MaxProvidersPerSite is how many providers of one site an answer may
// contribute: the first in name order.
const MaxProvidersPerSite = 64

// Result counts what one ingest kept and dropped.
type Result struct {
	Kept    int
	Dropped map[string]int
}

func (r *Result) drop(reason string, n int) {
	if n > 0 {
		r.Dropped[reason] += n
	}
}

type pending struct {
	row    signals.Stamped
	at     int64
	labels uint64
}

// Ingest stores the rows of a signals answer (reference §4.8, §4.9).
// dateMs is the answer's Date, nowMs the timeline now, wallMs the wall
// clock (for the epoch admission bound), owner the verified site that
// answered; local marks the site's own operator, whose grid_site labels are
// trusted because it bound them to verified identities.
func (s *Store) Ingest(body []byte, dateMs, nowMs, wallMs int64, owner string, local bool) Result {
	res := Result{Dropped: map[string]int{}}
	groups := map[Key][]pending{}
	drops, err := signals.Parse(body, func(st *signals.Stamped) {
		age, ok := signals.AgeMs(dateMs, st.StampMs)
		if !ok {
			res.drop(DropSkew, 1)
			return
		}
		site := owner
		if label, ok := st.Label(signals.LabelSite); ok {
			if !local && label != owner {
				res.drop(DropSiteMismatch, 1)
				return
			}
			site = label
		}
		switch signals.Check(&st.Row) {
		case "":
		case signals.RefuseName:
			res.drop(DropName, 1)
			return
		case signals.RefuseProvider:
			res.drop(DropProvider, 1)
			return
		default:
			res.drop(DropValue, 1)
			return
		}
		p, _ := st.Label(signals.LabelProvider)
		k := Key{site, p}
		groups[k] = append(groups[k], pending{row: *st, at: nowMs - age, labels: hashLabels(st.Labels)})
	})
	if err != nil {
		res.drop(DropParse, 1)
		return res
	}
	res.drop(DropParse, drops)

	keys := make([]Key, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sortKeys(keys)
	perSite := map[string]int{}

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		rows := groups[k]
		if perSite[k.Site]++; perSite[k.Site] > MaxProvidersPerSite {
			res.drop(DropCap, len(rows))
			continue
		}
		e := s.keys[k]
		if e == nil {
			if len(s.keys) >= MaxKeys || s.perSite[k.Site] >= MaxKeysPerSite {
				res.drop(DropCap, len(rows))
				continue
			}
			e = &entry{series: map[string]*series{}}
			s.keys[k] = e
			s.perSite[k.Site]++
		}
		if !s.admitBatch(e, rows, wallMs, &res) {
			continue
		}
		for i := range rows {
			p := &rows[i]
			e.newestAt = max(e.newestAt, p.at)
			if p.row.Name == signals.Info {
				if m, _ := p.row.Label(signals.LabelModel); p.at >= e.infoAt {
					e.model, e.infoAt = m, p.at
				}
			}
			ser := e.series[p.row.Name]
			if ser == nil {
				if len(e.series) >= MaxMetricsPerKey {
					res.Kept++ // silently ignored, as the reference does
					continue
				}
				ser = &series{sum: p.row.Name == signals.EPPFlowControlQueue}
				e.series[p.row.Name] = ser
			}
			ser.push(p.at, p.row.Value, p.labels, p.row.StampMs, s.windowMs)
			res.Kept++
		}
	}
	return res
}

// admitBatch applies the batch fence and the learning gate to one key's rows
// (reference §4.9). It reports whether the rows are stored.
func (s *Store) admitBatch(e *entry, rows []pending, wallMs int64, res *Result) bool {
	var meta *pending
	for i := range rows {
		if rows[i].row.Name == signals.ConfigGeneration {
			meta = &rows[i]
			break
		}
	}
	if meta == nil {
		e.learnable = false // missing metadata disables learning, not reading
		return true
	}
	b, ok := signals.ParseBatch(&meta.row.Row)
	if !ok {
		e.learnable = false
		res.drop(DropParse, 1)
		return true
	}
	if b.Epoch > wallMs+signals.EpochAheadMs {
		res.drop(DropSkew, len(rows)) // refused before any fence is kept
		return false
	}
	if e.fence != nil {
		if b.Before(*e.fence) {
			res.drop(DropDelayed, len(rows))
			return false
		}
		if b.Same(*e.fence) {
			return false // a republish: its age and learning lifetime stay
		}
		if b.UID != e.fence.UID || b.Generation != e.fence.Generation || b.Epoch != e.fence.Epoch {
			e.generation++ // a new identity: learned capacity starts over
		}
	}
	e.fence = &b
	samples := 0
	for i := range rows {
		if rows[i].row.Name != signals.ConfigGeneration && rows[i].row.StampMs == meta.row.StampMs {
			samples++
		}
	}
	e.learnable = b.Samples > 0 && int64(samples) == b.Samples
	return true
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
