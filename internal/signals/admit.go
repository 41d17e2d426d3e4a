package signals

import (
	"slices"
	"strconv"
	"strings"
)

// Refusal is why a receiver does not keep a row. Both receivers (an
// operator reading a peer, a gateway reading its operator) decide with the
// same rules (docs/protocol.md §4.7, §4.9) and count each refusal once. Each side's
// metric spells the reason as the reference's series names it: see
// PeerLabel and IngestLabel.
type Refusal uint8

// The refusals, in the order the rules are applied to one row.
const (
	// RefuseParse: not a line of the wire grammar (docs/protocol.md §2.2),
	// or a batch metadata line whose labels are not numbers.
	RefuseParse Refusal = iota
	// RefuseSite: attributed to another site than the one that answered.
	RefuseSite
	// RefuseName: not a contract series.
	RefuseName
	// RefuseProvider: grid_provider is not a DNS-1123 label.
	RefuseProvider
	// RefuseValue: not finite, negative, or above 1 for a flag or a ratio;
	// or an info line whose model is not a model name.
	RefuseValue
	// RefuseAge: stamped more than 1 s past its answer's Date, or more than
	// a day before it.
	RefuseAge
	// RefuseProviderCap: past the first MaxPeerProviders providers of a site.
	RefuseProviderCap
	// RefuseStoreCap: the receiver's store holds as many keys as it may.
	RefuseStoreCap
	// RefuseEpoch: a batch whose publisher epoch is more than EpochAheadMs
	// ahead of the receiver's wall clock.
	RefuseEpoch
	// RefuseDelayed: a batch published before one already held.
	RefuseDelayed

	numRefusals
)

// refusalLabels spells each refusal in the two metrics that count them.
// The peer spellings are grid_peer_signals_refused_total's, the ingest
// spellings grid_signals_ingest_dropped_total's; both are part of the
// external contract (docs/protocol.md §5), so where the two series named the
// same refusal differently each keeps its name: an out-of-bounds age is
// "age" between operators and "skew" at the gateway, whose skew count is
// the evidence it reports to its operator.
var refusalLabels = [numRefusals]struct{ peer, ingest string }{
	RefuseParse:       {"parse", "parse"},
	RefuseSite:        {"site", "site_mismatch"},
	RefuseName:        {"name", "name"},
	RefuseProvider:    {"provider", "provider"},
	RefuseValue:       {"value", "value"},
	RefuseAge:         {"age", "skew"},
	RefuseProviderCap: {"provider_cap", "cap"},
	RefuseStoreCap:    {"store_cap", "cap"},
	RefuseEpoch:       {"epoch", "skew"},
	RefuseDelayed:     {"delayed", "delayed"},
}

// PeerLabel is the reason label of grid_peer_signals_refused_total.
func (r Refusal) PeerLabel() string { return refusalLabels[r].peer }

// IngestLabel is the reason label of grid_signals_ingest_dropped_total.
func (r Refusal) IngestLabel() string { return refusalLabels[r].ingest }

// String names the refusal by its peer label.
func (r Refusal) String() string {
	if r >= numRefusals {
		return "Refusal(" + strconv.Itoa(int(r)) + ")"
	}
	return r.PeerLabel()
}

// Refusals lists every refusal, for pre-created counters.
func Refusals() []Refusal {
	out := make([]Refusal, numRefusals)
	for i := range out {
		out[i] = Refusal(i)
	}
	return out
}

// Tally counts refusals by kind.
type Tally [numRefusals]int

// Add counts n refusals of r.
func (t *Tally) Add(r Refusal, n int) { t[r] += n }

// Total is the number of refusals counted.
func (t *Tally) Total() int {
	n := 0
	for _, c := range t {
		n += c
	}
	return n
}

// Aged is an admitted row with its age against its answer's Date.
type Aged struct {
	Stamped
	AgeMs int64
}

// Group is one provider's admitted rows from one answer.
type Group struct {
	Site, Provider string
	Rows           []Aged
	// Batch is the group's batch metadata, when it carried a line that
	// parsed; MetaStampMs is that line's stamp.
	Batch       *Batch
	MetaStampMs int64
}

// LoadSamples counts the group's rows stamped with its batch metadata line,
// the metadata line itself excluded: a batch is whole when this equals the
// batch's declared sample count.
func (g *Group) LoadSamples() int64 {
	n := int64(0)
	for i := range g.Rows {
		if g.Rows[i].Name != ConfigGeneration && g.Rows[i].StampMs == g.MetaStampMs {
			n++
		}
	}
	return n
}

// Origin says who answered: the verified site, and whether it is this
// site's own operator relaying (whose grid_site labels are trusted, because
// it bound each row to a verified identity when it took it in). A row from
// any other answerer must carry grid_site equal to Site; a relayed row
// without grid_site is the relaying site's own.
type Origin struct {
	Site  string
	Relay bool
}

// Admit reads an answer and applies the row rules of docs/protocol.md §4.7
// (grammar, attribution, contract bounds, age) and its provider cap
// (the first MaxPeerProviders providers of each site in name order). It
// returns the admitted groups in (site, provider) order and counts every
// refused row in tally. A body that is not UTF-8 is refused whole: err is
// set and one parse refusal counted.
func Admit(body []byte, dateMs int64, o Origin, tally *Tally) ([]Group, error) {
	type key struct{ site, provider string }
	groups := map[key]*Group{}
	drops, err := Parse(body, func(s *Stamped) {
		site, ok := s.Label(LabelSite)
		switch {
		case !ok && o.Relay:
			site = o.Site
		case !o.Relay && site != o.Site:
			tally.Add(RefuseSite, 1) // a relayed third site, or a spoof
			return
		}
		if r, refused := Check(&s.Row); refused {
			tally.Add(r, 1)
			return
		}
		age, ok := AgeMs(dateMs, s.StampMs)
		if !ok {
			tally.Add(RefuseAge, 1)
			return
		}
		p, _ := s.Label(LabelProvider)
		k := key{site, p}
		g := groups[k]
		if g == nil {
			g = &Group{Site: site, Provider: p}
			groups[k] = g
		}
		g.Rows = append(g.Rows, Aged{Stamped: *s, AgeMs: age})
	})
	if err != nil {
		tally.Add(RefuseParse, 1)
		return nil, err
	}
	tally.Add(RefuseParse, drops)

	out := make([]Group, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b Group) int {
		if c := strings.Compare(a.Site, b.Site); c != 0 {
			return c
		}
		return strings.Compare(a.Provider, b.Provider)
	})
	kept := out[:0]
	perSite := 0
	for i := range out {
		g := &out[i]
		if i == 0 || out[i-1].Site != g.Site {
			perSite = 0
		}
		if perSite++; perSite > MaxPeerProviders {
			tally.Add(RefuseProviderCap, len(g.Rows))
			continue
		}
		for j := range g.Rows {
			if g.Rows[j].Name != ConfigGeneration {
				continue
			}
			if b, ok := ParseBatch(&g.Rows[j].Row); ok {
				g.Batch, g.MetaStampMs = &b, g.Rows[j].StampMs
			} else {
				// Metadata that does not parse is refused; the rest of the
				// group is kept without a batch (readable, not learnable).
				tally.Add(RefuseParse, 1)
				g.Rows = slices.Delete(g.Rows, j, j+1)
			}
			break
		}
		if len(g.Rows) > 0 {
			kept = append(kept, *g)
		}
	}
	return kept, nil
}

// Fence is the newest publication a receiver holds for one provider: the
// batch ordering of docs/protocol.md §4.9. Its zero value holds nothing.
type Fence struct {
	held Batch
	set  bool
}

// Decision is what a receiver does with a provider's batch.
type Decision uint8

const (
	// Store the rows: the batch is newer than the one held (or the first,
	// or carried no metadata), and the fence has moved to it.
	Store Decision = iota
	// Republish: the same publication again. Keep what is held, with the
	// age and lifetime of the first publication; not a refusal.
	Republish
	// Refuse: the rows are dropped and counted with the returned Refusal;
	// the fence is unchanged.
	Refuse
)

// Admit decides on b (nil when the group carried no batch metadata) at the
// receiver's wall clock wallMs. On Store, renewed reports that the
// publication comes from another provider identity than the one held (its
// uid, config generation or publisher epoch changed): what was learned from
// the old identity no longer applies.
func (f *Fence) Admit(b *Batch, wallMs int64) (d Decision, r Refusal, renewed bool) {
	if b == nil {
		return Store, 0, false
	}
	if b.Epoch > wallMs+EpochAheadMs {
		return Refuse, RefuseEpoch, false // refused before any fence is kept
	}
	if f.set {
		if b.Before(f.held) {
			return Refuse, RefuseDelayed, false
		}
		if b.Same(f.held) {
			return Republish, 0, false
		}
		renewed = b.UID != f.held.UID || b.Generation != f.held.Generation || b.Epoch != f.held.Epoch
	}
	f.held, f.set = *b, true
	return Store, 0, renewed
}

// Held returns the batch the fence holds.
func (f *Fence) Held() (Batch, bool) { return f.held, f.set }
