package operator

import (
	"time"

	"github.com/grid-inference/grid/internal/signals"
)

// ingest keeps what a peer's answer may contribute: the rows signals.Admit
// admits (attributed to the peer itself, within the contract bounds, of its
// first 64 providers, with plausible ages; docs/protocol.md §4.7), of batches
// the fence admits. Kept rows are restamped on this operator's clock as now
// minus their age, so clock offsets between sites never enter. Every
// refusal is counted.
func (pp *peerPoller) ingest(ps *peerState, body []byte, date time.Time) {
	o := pp.o
	site := ps.cfg.Site
	now := o.clk.Now()
	var tally signals.Tally
	groups, _ := signals.Admit(body, date.UnixMilli(), signals.Origin{Site: site}, &tally)

	pp.mu.Lock()
	entries := make([]*Entry, 0, len(groups))
	for i := range groups {
		if e := pp.admit(&groups[i], now, &tally); e != nil {
			entries = append(entries, e)
		}
	}
	// Under pp.mu, so a reload that forgets this peer cannot be undone by
	// an answer that was in flight.
	o.peerStore.Replace(site+"/", entries)
	pp.mu.Unlock()
	pp.count(ps, &tally)
}

// admit applies the batch fence to one provider's rows and returns the
// entry the peer store keeps for it: a new one, the one held (a republish
// or a refused batch keeps what is held), or nil. pp.mu is held.
func (pp *peerPoller) admit(g *signals.Group, now time.Time, tally *signals.Tally) *Entry {
	key := g.Site + "/" + g.Provider
	fence := pp.fences[key]
	if fence == nil {
		fence = &signals.Fence{}
	}
	switch d, refusal, _ := fence.Admit(g.Batch, now.UnixMilli()); d {
	case signals.Refuse:
		tally.Add(refusal, len(g.Rows))
		return pp.o.peerStore.Get(key)
	case signals.Republish:
		// Its age and lifetime stay those of the first publication.
		return pp.o.peerStore.Get(key)
	}
	if g.Batch != nil {
		pp.fences[key] = fence
	}
	kept := make([]signals.Row, len(g.Rows))
	var oldest int64
	for i := range g.Rows {
		oldest = max(oldest, g.Rows[i].AgeMs)
		kept[i] = g.Rows[i].Row
		signals.SortLabels(kept[i].Labels)
	}
	at := now.Add(-time.Duration(oldest) * time.Millisecond)
	return &Entry{Target: key, Rows: kept, CollectedAt: at, ExpiresAt: now.Add(pp.o.peerStore.TTL()), Batch: g.Batch}
}

// count exports one answer's refusals and the peer's PeerAgesRejected state,
// which a WARN announces while it holds.
func (pp *peerPoller) count(ps *peerState, tally *signals.Tally) {
	o, site := pp.o, ps.cfg.Site
	for _, r := range signals.Refusals() {
		if n := tally[r]; n > 0 {
			o.m.peers.refused.WithLabelValues(site, r.PeerLabel()).Add(float64(n))
		}
	}
	rejected := tally[signals.RefuseAge] > 0
	pp.mu.Lock()
	ps.agesRejected = rejected
	pp.mu.Unlock()
	v := 0.0
	if rejected {
		v = 1
		o.log.Warn("rejecting relayed signal ages from a peer: its samples are stamped more than 1s past their Date or more than a day before it; check that site's clock",
			"peer", site, "rows", tally[signals.RefuseAge])
	}
	o.m.peers.agesRejected.WithLabelValues(site).Set(v)
}

// PeerAgesRejected lists the peers whose last answer carried rows refused
// for age, in name order.
func (o *Operator) PeerAgesRejected() []string {
	if o.poller == nil {
		return nil
	}
	var out []string
	for _, ps := range o.poller.snapshot() {
		o.poller.mu.Lock()
		if ps.agesRejected {
			out = append(out, ps.cfg.Site)
		}
		o.poller.mu.Unlock()
	}
	return out
}
