package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"
)

// BenchmarkHistoryAnswer: one read of GET /api/history with five minutes
// of points of three sites (about 128 KB), encoded at every read (as it
// was) and from the encoded answer (as it is).
func BenchmarkHistoryAnswer(b *testing.B) {
	h := newHistory()
	at := time.Unix(1_800_000_000, 0)
	one := 1.0
	for i := range historyMaxPoints {
		v := SnapshotView{Picks: map[string]uint64{}}
		for s := range 3 {
			site := fmt.Sprintf("site-%d", s)
			v.Sites = append(v.Sites, CandidateView{Site: site, Ready: true, InFlight: &one, Ceiling: &one, Rho: &one})
			v.Picks[site] = uint64(i * 10)
			h.firstByte(site, 50*time.Millisecond)
		}
		h.record(v, at.Add(time.Duration(i)*historyStep))
	}
	b.Run("encode-each", func(b *testing.B) {
		for b.Loop() {
			v, _ := h.view("east")
			json.NewEncoder(io.Discard).Encode(v)
		}
	})
	b.Run("encoded", func(b *testing.B) {
		for b.Loop() {
			io.Discard.Write(h.answer("east"))
		}
	})
}
