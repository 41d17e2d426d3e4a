// Package latency turns an EPP's cumulative request histograms and counters
// into recent latency: TTFT p50/p90, mean TPOT and the error ratio over a
// sliding window (docs/protocol.md §4.5). It also tells readiness when the engines
// behind the EPP made progress.
package latency

import (
	"math"
	"sort"
	"time"
)

// Window is how far back latency looks.
const Window = 30 * time.Second

// MinSamples is the fewest requests a published value may rest on.
const MinSamples = 20

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound float64
	Count      float64
}

// Snapshot is one scrape's cumulative counters, each summed across series.
type Snapshot struct {
	TTFT       []Bucket // streaming requests only, sorted by bound
	TTFTSum    float64
	TTFTCount  float64
	TPOTSum    float64
	TPOTCount  float64
	InputSum   float64
	InputCount float64
	Requests   float64
	Errors     float64
}

// AddTTFTBucket adds a bucket count (summing series that share a bound).
func (s *Snapshot) AddTTFTBucket(bound, count float64) {
	i := sort.Search(len(s.TTFT), func(i int) bool { return s.TTFT[i].UpperBound >= bound })
	if i < len(s.TTFT) && s.TTFT[i].UpperBound == bound {
		s.TTFT[i].Count += count
		return
	}
	s.TTFT = append(s.TTFT, Bucket{})
	copy(s.TTFT[i+1:], s.TTFT[i:])
	s.TTFT[i] = Bucket{bound, count}
}

// decreasedFrom reports whether any counter of s is below prev: the EPP
// restarted and its counters began again.
func (s *Snapshot) decreasedFrom(prev *Snapshot) bool {
	if s.TTFTSum < prev.TTFTSum || s.TTFTCount < prev.TTFTCount || s.TPOTSum < prev.TPOTSum ||
		s.TPOTCount < prev.TPOTCount || s.InputSum < prev.InputSum || s.InputCount < prev.InputCount ||
		s.Requests < prev.Requests || s.Errors < prev.Errors {
		return true
	}
	for _, pb := range prev.TTFT {
		if s.bucket(pb.UpperBound) < pb.Count {
			return true
		}
	}
	return false
}

func (s *Snapshot) bucket(bound float64) float64 {
	i := sort.Search(len(s.TTFT), func(i int) bool { return s.TTFT[i].UpperBound >= bound })
	if i < len(s.TTFT) && s.TTFT[i].UpperBound == bound {
		return s.TTFT[i].Count
	}
	return 0
}

// Published is what the window supports; a nil field is not published.
type Published struct {
	TTFTP50    *float64
	TTFTP90    *float64
	TPOT       *float64
	ErrorRatio *float64
}

type entry struct {
	at   time.Time
	snap Snapshot
}

// History is one provider's window of snapshots.
type History struct {
	entries []entry
}

// Observe adds the snapshot taken at now and returns what to publish and
// whether the engines made progress since the previous snapshot (a TTFT, TPOT
// or input-token count rose within the window; request counters alone do not
// count). multiPool suppresses both: an EPP serving several pools labels its
// histograms by model, so its latency cannot be attributed to one pool.
func (h *History) Observe(now time.Time, snap Snapshot, multiPool bool) (pub Published, progress bool) {
	if n := len(h.entries); n > 0 {
		last := &h.entries[n-1].snap
		if snap.decreasedFrom(last) {
			h.entries = append(h.entries[:0], entry{now, snap})
			return Published{}, false
		}
		if !multiPool && now.Sub(h.entries[n-1].at) <= Window &&
			(snap.TTFTCount > last.TTFTCount || snap.TPOTCount > last.TPOTCount || snap.InputCount > last.InputCount) {
			progress = true
		}
	}
	// Keep one snapshot at or before the window start.
	for len(h.entries) >= 2 && now.Sub(h.entries[1].at) >= Window {
		h.entries = h.entries[1:]
	}
	if len(h.entries) > 0 && !multiPool {
		pub = delta(&h.entries[0].snap, &snap)
	}
	h.entries = append(h.entries, entry{now, snap})
	return pub, progress
}

func delta(front, cur *Snapshot) Published {
	var pub Published
	if n := cur.TTFTCount - front.TTFTCount; n >= MinSamples {
		buckets := make([]Bucket, len(cur.TTFT))
		for i, b := range cur.TTFT {
			buckets[i] = Bucket{b.UpperBound, b.Count - front.bucket(b.UpperBound)}
		}
		if v, ok := Quantile(0.5, buckets); ok {
			pub.TTFTP50 = &v
		}
		if v, ok := Quantile(0.9, buckets); ok {
			pub.TTFTP90 = &v
		}
	}
	if n := cur.TPOTCount - front.TPOTCount; n >= MinSamples {
		v := (cur.TPOTSum - front.TPOTSum) / n
		pub.TPOT = &v
	}
	if n := cur.Requests - front.Requests; n >= MinSamples {
		v := math.Min(1, math.Max(0, (cur.Errors-front.Errors)/n))
		pub.ErrorRatio = &v
	}
	return pub
}

// Quantile interpolates quantile q over cumulative buckets sorted by bound,
// as Prometheus' histogram_quantile does, with the reference's edge rules: a
// rank that lands in the +Inf bucket returns the previous bound, and a rank
// no bucket reaches returns the last finite bound.
func Quantile(q float64, buckets []Bucket) (float64, bool) {
	if len(buckets) == 0 {
		return 0, false
	}
	total := buckets[len(buckets)-1].Count
	if total <= 0 {
		return 0, false
	}
	rank := q * total
	prevBound, prevCount := 0.0, 0.0
	lastFinite := 0.0
	for _, b := range buckets {
		if !math.IsInf(b.UpperBound, 1) {
			lastFinite = b.UpperBound
		}
		if b.Count >= rank {
			if math.IsInf(b.UpperBound, 1) {
				return prevBound, true
			}
			if b.Count == prevCount {
				return b.UpperBound, true
			}
			return prevBound + (b.UpperBound-prevBound)*(rank-prevCount)/(b.Count-prevCount), true
		}
		prevBound, prevCount = b.UpperBound, b.Count
	}
	return lastFinite, true
}
