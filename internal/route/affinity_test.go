package route

import "testing"

// affinityWorld: sites a (8 slots) and b (24), learned, a reading at 2000.
func affinityWorld(t *testing.T, aRunning float64) *world {
	w := newWorld(t, "a", "b")
	w.ageAware, w.meanMs, w.set.WindowMs, w.set.CeilingFloor = true, 10_000, 60_000, 1
	w.teachThenRead(map[string]float64{"a": 8, "b": 24}, map[string]float64{"a": aRunning, "b": 0})
	return w
}

// TestKeepHonoursLoadAdmissionAndHealth: a bound session stays on its site
// while it admits existing sessions, is healthy and reads below the
// threshold; an existing-only site keeps it but takes no new request.
func TestKeepHonoursLoadAdmissionAndHealth(t *testing.T) {
	for _, tc := range []struct {
		name      string
		aRunning  float64
		admission Admission
		zeroReady bool
		want      Verdict
	}{
		{"room", 2, NewAndExisting, false, Kept},
		{"at the threshold", 7, NewAndExisting, false, Saturated}, // 7 of 8 = 0.875
		{"existing only keeps its sessions", 2, ExistingOnly, false, Kept},
		{"closed", 2, Closed, false, Gone},
		{"unready", 2, NewAndExisting, true, Gone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := affinityWorld(t, tc.aRunning)
			w.cands[0].Admission = tc.admission
			at := int64(2000)
			if tc.zeroReady {
				at = 2100
				w.publish("a", at, obs{running: tc.aRunning, zero: true, queue: f(0)})
			}
			snap := w.build(at)
			p, v := snap.Keep("m", "a", "p", at, 0.8)
			if v != tc.want {
				t.Fatalf("verdict %d, want %d", v, tc.want)
			}
			if v == Kept && (p.Candidate.Site != "a" || p.Path != PathSession) {
				t.Errorf("kept on %s by %v", p.Candidate.Site, p.Path)
			}
			if tc.admission == ExistingOnly {
				for turn := range uint64(50) {
					if c := boardOnly(snap).Pick("m", turn, 2000).Candidate; c.Site == "a" {
						t.Fatal("an existing-only site drew a new request")
					}
				}
			}
		})
	}
	if _, v := affinityWorld(t, 2).build(2000).Keep("m", "gone", "p", 2000, 0.8); v != Gone {
		t.Errorf("a site no longer in the snapshot: verdict %d, want Gone", v)
	}
}

// TestKeepStaysWhenNowhereHasRoom: past the threshold a bound session
// moves only to a site that reads below it; when none does, it stays
// within the bounded-loads slack of the mean (a move would add a whole
// prompt's prefill where there is no room either), and moves beyond it.
func TestKeepStaysWhenNowhereHasRoom(t *testing.T) {
	for _, tc := range []struct {
		name          string
		aRun, bRun    float64 // of 8 and 24 slots
		threshold     float64
		want          Verdict
		moveReasoning string
	}{
		{"room elsewhere", 7, 0, 0.8, Saturated, "b reads 0"},
		{"nowhere has room, a near the mean", 7, 22, 0.8, Kept, "a 0.875, b 0.917, mean 0.906"},
		{"nowhere has room, a within the slack", 7, 13, 0.5, Kept, "a 0.875 ≤ 1.25 × 0.625 + 1/8"},
		{"nowhere has room, a beyond the slack", 7, 8, 0.3, Saturated, "a 0.875 > 1.25 × 0.469 + 1/8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "a", "b")
			w.ageAware, w.meanMs, w.set.WindowMs, w.set.CeilingFloor = true, 10_000, 60_000, 1
			w.teachThenRead(map[string]float64{"a": 8, "b": 24}, map[string]float64{"a": tc.aRun, "b": tc.bRun})
			if _, v := boardOnly(w.build(2000)).Keep("m", "a", "p", 2000, tc.threshold); v != tc.want {
				t.Fatalf("verdict %d, want %d (%s)", v, tc.want, tc.moveReasoning)
			}
		})
	}
}

// TestKeepCountsOwnSends: a burst of bound requests fills its site; once
// this gateway's own sends take it past the threshold, the rest fail over.
func TestKeepCountsOwnSends(t *testing.T) {
	w := affinityWorld(t, 0)
	snap := w.build(2000)
	kept := 0
	for range 20 {
		if _, v := snap.Keep("m", "a", "p", 2000, 0.8); v == Kept {
			kept++
		}
	}
	if kept != 7 { // 0.8 of 8 slots: the 7th send reads 6/8, the 8th 7/8
		t.Errorf("%d of 20 bound requests kept on an idle 8-slot site, want 7", kept)
	}
}

// TestPreferIsConsistentAndWeighted: one prefix maps to one site every
// time; over many prefixes the sites take shares near their capacity (8 and
// 24: a quarter and three quarters); a site at the threshold yields its
// prefixes to the other; removing a site moves only its own prefixes.
func TestPreferIsConsistentAndWeighted(t *testing.T) {
	w := affinityWorld(t, 0)
	snap := w.build(2000)
	where := func(s *Snapshot, h uint64) string {
		p, ok := boardOnly(s).Prefer("m", h, 2000, 0.8)
		if !ok {
			return ""
		}
		return p.Candidate.Site
	}
	toA := 0
	const n = 4000
	first := map[uint64]string{}
	for h := range uint64(n) {
		h = h * 0x9E3779B97F4A7C15
		site := where(snap, h)
		if again := where(snap, h); again != site {
			t.Fatalf("prefix %x went to %s, then %s", h, site, again)
		}
		first[h] = site
		if site == "a" {
			toA++
		}
	}
	if share := float64(toA) / n; share < 0.22 || share > 0.28 {
		t.Errorf("a (8 of 32 slots) preferred for %.3f of prefixes, want about 0.25", share)
	}
	// a read busy: its prefixes yield to b.
	busy := affinityWorld(t, 7).build(2000)
	for h, site := range first {
		if got := where(busy, h); got != "b" {
			t.Fatalf("prefix of %s with a at 7/8: went to %q, want b", site, got)
		}
	}
	// a closed: b's prefixes stay on b.
	w.cands[0].Admission = Closed
	closed := w.build(2000)
	for h, site := range first {
		if site == "b" && where(closed, h) != "b" {
			t.Fatal("a prefix of b moved when a left")
		}
	}
}

// TestPreferBoundsLoad: prefixes that all hash to one site do not drown
// it: once its load passes the bounded-load share of the mean, or the
// threshold, the preference yields.
func TestPreferBoundsLoad(t *testing.T) {
	w := affinityWorld(t, 0)
	snap := w.build(2000)
	var hot uint64
	for h := uint64(1); ; h++ {
		if p, _ := boardOnly(snap).Prefer("m", h, 2000, 0.8); p.Candidate.Site == "a" {
			hot = h
			break
		}
	}
	toA := 0
	for range 40 {
		if p, ok := snap.Prefer("m", hot, 2000, 0.8); ok && p.Candidate.Site == "a" {
			toA++
		}
	}
	if toA == 0 || toA > 7 {
		t.Errorf("one hot prefix sent %d requests to an idle 8-slot site, want 1–7", toA)
	}
}

// TestAffinityAllocatesNothing: Keep and Prefer run on the request path.
func TestAffinityAllocatesNothing(t *testing.T) {
	w := affinityWorld(t, 2)
	snap := w.build(2000)
	h := uint64(0)
	if n := testing.AllocsPerRun(1000, func() { snap.Keep("m", "b", "p", 2000, 0.8) }); n != 0 {
		t.Errorf("Keep: %v allocations", n)
	}
	if n := testing.AllocsPerRun(1000, func() { h++; snap.Prefer("m", h, 2000, 0.8) }); n != 0 {
		t.Errorf("Prefer: %v allocations", n)
	}
}
