package operator

import (
	"sort"
	"time"

	"github.com/grid-inference/grid/internal/signals"
)

// ingest keeps what a peer's answer may contribute (reference §4.7 step 4,
// §4.9): rows attributed to the peer itself, within the contract bounds, of
// its first 64 providers, with plausible ages and batches in order. Kept
// rows are restamped on this operator's clock as now minus their age, so
// clock offsets between sites never enter. Every refusal is counted.
func (pp *peerPoller) ingest(ps *peerState, body []byte, date time.Time) {
	o := pp.o
	site := ps.cfg.Site
	now := o.clk.Now()
	nowMs, dateMs := now.UnixMilli(), date.UnixMilli()
	refuse := func(reason string, n int) {
		if n > 0 {
			o.m.peers.refused.WithLabelValues(site, reason).Add(float64(n))
		}
	}

	byProvider := map[string][]signals.Stamped{}
	signals.Parse(body, func(s *signals.Stamped) {
		if origin, _ := s.Label(signals.LabelSite); origin != site {
			refuse(signals.RefuseSite, 1) // a relayed third site, or a spoof
			return
		}
		if reason := signals.Check(&s.Row); reason != "" {
			refuse(reason, 1)
			return
		}
		p, _ := s.Label(signals.LabelProvider)
		byProvider[p] = append(byProvider[p], *s)
	})
	providers := make([]string, 0, len(byProvider))
	for p := range byProvider {
		providers = append(providers, p)
	}
	sort.Strings(providers)
	if len(providers) > signals.MaxPeerProviders {
		for _, p := range providers[signals.MaxPeerProviders:] {
			refuse(signals.RefuseProviderCap, len(byProvider[p]))
		}
		providers = providers[:signals.MaxPeerProviders]
	}

	ttl := o.peerStore.TTL()
	ageRefused := 0
	var entries []*Entry
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, p := range providers {
		key := site + "/" + p
		rows := byProvider[p]
		keepOld := func() {
			if old := o.peerStore.Get(key); old != nil {
				entries = append(entries, old)
			}
		}
		var batch *signals.Batch
		for i := range rows {
			if b, ok := signals.ParseBatch(&rows[i].Row); ok {
				batch = &b
				break
			}
		}
		if batch != nil {
			if batch.Epoch > nowMs+signals.EpochAheadMs {
				refuse(signals.RefuseEpoch, len(rows))
				keepOld()
				continue
			}
			if fence, ok := pp.fences[key]; ok {
				if batch.Before(fence) {
					refuse(signals.RefuseDelayed, len(rows))
					keepOld()
					continue
				}
				if batch.Same(fence) {
					// A republish: its age and lifetime stay those of the
					// first publication. Not a drop.
					keepOld()
					continue
				}
			}
		}
		var kept []signals.Row
		var oldest int64 = -1
		for i := range rows {
			age, ok := signals.AgeMs(dateMs, rows[i].StampMs)
			if !ok {
				ageRefused++
				continue
			}
			oldest = max(oldest, age)
			row := rows[i].Row
			signals.SortLabels(row.Labels)
			kept = append(kept, row)
		}
		if len(kept) == 0 {
			keepOld()
			continue
		}
		if batch != nil {
			pp.fences[key] = *batch
		}
		at := now.Add(-time.Duration(oldest) * time.Millisecond)
		entries = append(entries, &Entry{Target: key, Rows: kept, CollectedAt: at, ExpiresAt: now.Add(ttl), Batch: batch})
	}
	refuse(signals.RefuseAge, ageRefused)
	o.peerStore.Replace(site+"/", entries)
	ps.agesRejected = ageRefused > 0
	v := 0.0
	if ps.agesRejected {
		v = 1
	}
	o.m.peers.agesRejected.WithLabelValues(site).Set(v)
	if ps.agesRejected {
		o.log.Warn("rejecting relayed signal ages from a peer: its samples are stamped more than 1s past their Date or more than a day before it; check that site's clock",
			"peer", site, "rows", ageRefused)
	}
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
