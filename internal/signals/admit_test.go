package signals

import (
	"fmt"
	"strings"
	"testing"
)

func TestRefusalLabels(t *testing.T) {
	// The two series' reason vocabularies as the external contract names
	// them (docs/protocol.md §5): changing one breaks dashboards.
	want := map[Refusal][2]string{
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
	if len(Refusals()) != len(want) {
		t.Fatalf("%d refusals, the table has %d", len(Refusals()), len(want))
	}
	for _, r := range Refusals() {
		if got := [2]string{r.PeerLabel(), r.IngestLabel()}; got != want[r] {
			t.Errorf("%d: labels %v, want %v", r, got, want[r])
		}
	}
	if s := Refusal(200).String(); s != "Refusal(200)" {
		t.Errorf("out of range: %q", s)
	}
}

func line(name, site, provider string, v float64, stamp int64, extra ...string) string {
	labels := []string{fmt.Sprintf("grid_provider=%q", provider)}
	if site != "" {
		labels = append(labels, fmt.Sprintf("grid_site=%q", site))
	}
	labels = append(labels, extra...)
	return fmt.Sprintf("%s{%s} %v %d\n", name, strings.Join(labels, ","), v, stamp)
}

func meta(site, provider string, epoch, seq, samples, stamp int64) string {
	return line(ConfigGeneration, site, provider, 1, stamp,
		fmt.Sprintf(`batch_samples="%d"`, samples), fmt.Sprintf(`batch_sequence="%d"`, seq),
		`provider_uid="u"`, fmt.Sprintf(`publisher_epoch="%d"`, epoch))
}

// TestAdmit is docs/protocol.md §4.7 as worked examples: each answer,
// who answered, what is kept and what is refused.
func TestAdmit(t *testing.T) {
	const date = 1_000_000
	peer := Origin{Site: "west"}
	relay := Origin{Site: "east", Relay: true}
	many := func() string {
		var b strings.Builder
		for i := range MaxPeerProviders + 2 {
			b.WriteString(line(Ready, "west", fmt.Sprintf("p%02d", i), 1, date))
		}
		return b.String()
	}()
	for _, tc := range []struct {
		name   string
		origin Origin
		body   string
		groups string // site/provider:rows, in order
		refuse map[Refusal]int
	}{
		{"peer rows kept, ages from Date", peer,
			line(Ready, "west", "a", 1, date-300) + line(InFlight, "west", "a", 3, date-300),
			"west/a:2", nil},
		{"a peer may not speak for another site or omit its own", peer,
			line(Ready, "north", "n", 1, date) + line(Ready, "", "x", 1, date) + line(Ready, "west", "a", 1, date),
			"west/a:1", map[Refusal]int{RefuseSite: 2}},
		{"the relaying operator's labels are trusted; no label is its own site", relay,
			line(Ready, "west", "w", 1, date) + line(Ready, "", "e", 1, date),
			"east/e:1 west/w:1", nil},
		{"contract bounds", peer,
			line("go_goroutines", "west", "a", 1, date) + line(Ready, "west", "Bad_P", 1, date) +
				line(Ready, "west", "a", 2, date) + line(InFlight, "west", "a", -1, date) + "garbage {{\n",
			"", map[Refusal]int{RefuseName: 1, RefuseProvider: 1, RefuseValue: 2, RefuseParse: 1}},
		{"ages: 1 s ahead is the Date's resolution, 2 s is not; a day old is the limit", peer,
			line(Ready, "west", "a", 1, date+1000) + line(Ready, "west", "b", 1, date+2000) +
				line(Ready, "west", "c", 1, date-86_400_000) + line(Ready, "west", "d", 1, date-86_400_001),
			"west/a:1 west/c:1", map[Refusal]int{RefuseAge: 2}},
		{"the first 64 providers of a site in name order", peer, many,
			"", map[Refusal]int{RefuseProviderCap: 2}},
		{"metadata that does not parse is refused, the rest kept without a batch", peer,
			line(Ready, "west", "a", 1, date) + line(ConfigGeneration, "west", "a", 1, date, `batch_sequence="x"`),
			"west/a:1", map[Refusal]int{RefuseParse: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tally Tally
			groups, err := Admit([]byte(tc.body), date, tc.origin, &tally)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, g := range groups {
				got = append(got, fmt.Sprintf("%s/%s:%d", g.Site, g.Provider, len(g.Rows)))
			}
			if tc.name == "the first 64 providers of a site in name order" {
				if len(groups) != MaxPeerProviders || groups[63].Provider != "p63" {
					t.Errorf("kept %d providers, last %s", len(groups), groups[len(groups)-1].Provider)
				}
			} else if s := strings.Join(got, " "); s != tc.groups {
				t.Errorf("groups %q, want %q", s, tc.groups)
			}
			var want Tally
			for r, n := range tc.refuse {
				want.Add(r, n)
			}
			if tally != want {
				t.Errorf("refused %v, want %v", tally, want)
			}
		})
	}
	t.Run("ages and batch", func(t *testing.T) {
		var tally Tally
		groups, _ := Admit([]byte(line(InFlight, "west", "a", 2, date-300)+meta("west", "a", 7, 3, 1, date-300)), date, peer, &tally)
		if len(groups) != 1 || groups[0].Batch == nil || groups[0].Batch.Sequence != 3 || groups[0].LoadSamples() != 1 {
			t.Fatalf("groups %+v", groups)
		}
		if groups[0].Rows[0].AgeMs != 300 {
			t.Errorf("age %d, want 300", groups[0].Rows[0].AgeMs)
		}
	})
	t.Run("not UTF-8", func(t *testing.T) {
		var tally Tally
		if _, err := Admit([]byte("grid_provider_ready{grid_provider=\"a\xff\"} 1 1\n"), date, peer, &tally); err == nil || tally[RefuseParse] != 1 {
			t.Errorf("err %v, tally %v", err, tally)
		}
	})
}

// TestFence is docs/protocol.md §4.9 as a sequence of batches at one
// receiver.
func TestFence(t *testing.T) {
	const wall = 10_000_000
	var f Fence
	b := func(uid string, epoch, seq int64) *Batch {
		return &Batch{UID: uid, Epoch: epoch, Sequence: seq, Generation: 1}
	}
	for i, step := range []struct {
		batch   *Batch
		d       Decision
		refusal Refusal
		renewed bool
		held    int64 // sequence held after the step
	}{
		{nil, Store, 0, false, 0},                        // no metadata: stored, nothing fenced
		{b("u", 5, 10), Store, 0, false, 10},             // the first batch
		{b("u", 5, 10), Republish, 0, false, 10},         // the same again
		{b("u", 5, 9), Refuse, RefuseDelayed, false, 10}, // older
		{b("u", 4, 99), Refuse, RefuseDelayed, false, 10},
		{b("u", wall+EpochAheadMs+1, 1), Refuse, RefuseEpoch, false, 10}, // no fence kept for it
		{b("u", wall+EpochAheadMs, 1), Store, 0, true, 1},                // at the bound: a restart
		{b("v", wall+EpochAheadMs, 2), Store, 0, true, 2},                // a new uid
		{b("v", wall+EpochAheadMs, 3), Store, 0, false, 3},
	} {
		d, r, renewed := f.Admit(step.batch, wall)
		held, _ := f.Held()
		if d != step.d || (d == Refuse && r != step.refusal) || renewed != step.renewed || held.Sequence != step.held {
			t.Errorf("step %d: %v %v renewed=%v held %d; want %v %v %v %d", i, d, r, renewed, held.Sequence, step.d, step.refusal, step.renewed, step.held)
		}
	}
}

// FuzzAdmit holds Admit to its promises whatever the body: every kept row
// passes Check, is attributed to the answering site, has an admissible age,
// and no site contributes more than MaxPeerProviders providers.
func FuzzAdmit(f *testing.F) {
	f.Add([]byte(line(Ready, "west", "a", 1, 1000)+meta("west", "a", 1, 1, 1, 1000)), false)
	f.Add([]byte(line(Ready, "", "a", 1, 1000)+line(Ready, "north", "b", 7, 1)), true)
	f.Fuzz(func(t *testing.T, body []byte, relay bool) {
		var tally Tally
		groups, _ := Admit(body, 1000, Origin{Site: "west", Relay: relay}, &tally)
		perSite := map[string]int{}
		for _, g := range groups {
			perSite[g.Site]++
			if !relay && g.Site != "west" {
				t.Fatalf("kept a row of site %q from west", g.Site)
			}
			for _, r := range g.Rows {
				if reason, refused := Check(&r.Row); refused {
					t.Fatalf("kept a row refused for %v: %+v", reason, r)
				}
				if _, ok := AgeMs(1000, r.StampMs); !ok || r.AgeMs < 0 {
					t.Fatalf("kept a row of age %d", r.AgeMs)
				}
			}
		}
		for site, n := range perSite {
			if n > MaxPeerProviders {
				t.Fatalf("site %s contributed %d providers", site, n)
			}
		}
	})
}
