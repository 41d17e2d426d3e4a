package signals

import (
	"math"
	"strings"
	"testing"
)

func TestRenderParseRoundTrip(t *testing.T) {
	rows := []Row{
		{Name: Ready, Labels: []Label{{LabelProvider, "pool-a"}, {LabelSite, "hub"}}, Value: 1},
		{Name: EPPAverageQueue, Labels: []Label{{LabelProvider, "pool-a"}, {LabelSite, "hub"}, {"name", `we"ird\` + "\n"}}, Value: 0.5},
		{Name: InFlight, Labels: []Label{{LabelProvider, "pool-a"}, {LabelSite, "hub"}}, Value: 1e6},
	}
	var body []byte
	for i := range rows {
		body = AppendLine(body, &rows[i], 1787220005812)
	}
	want := `grid_provider_ready{grid_provider="pool-a",grid_site="hub"} 1 1787220005812
llm_d_epp_average_queue_size{grid_provider="pool-a",grid_site="hub",name="we\"ird\\\n"} 0.5 1787220005812
grid_provider_in_flight_requests{grid_provider="pool-a",grid_site="hub"} 1000000 1787220005812
`
	if string(body) != want {
		t.Fatalf("rendered:\n%s\nwant:\n%s", body, want)
	}
	var got []Stamped
	drops, err := Parse(body, func(s *Stamped) { got = append(got, *s) })
	if err != nil || drops != 0 || len(got) != 3 {
		t.Fatalf("parsed %d rows, %d drops, %v", len(got), drops, err)
	}
	if v, _ := got[1].Label("name"); v != "we\"ird\\\n" || got[2].Value != 1e6 || got[0].StampMs != 1787220005812 {
		t.Errorf("round trip lost data: %+v", got)
	}
}

func TestParseDrops(t *testing.T) {
	for _, tc := range []struct {
		name, line string
	}{
		{"no label set", "grid_provider_ready 1 5"},
		{"no timestamp", `grid_provider_ready{grid_provider="a"} 1`},
		{"NaN", `grid_provider_ready{grid_provider="a"} NaN 5`},
		{"Inf", `grid_provider_ready{grid_provider="a"} +Inf 5`},
		{"no provider", `grid_provider_ready{grid_site="s"} 1 5`},
		{"two providers", `grid_provider_ready{grid_provider="a",grid_provider="b"} 1 5`},
		{"two sites", `grid_provider_ready{grid_provider="a",grid_site="s",grid_site="t"} 1 5`},
		{"slash in provider", `grid_provider_ready{grid_provider="a/b"} 1 5`},
		{"control char", "grid_provider_ready{grid_provider=\"a\x01\"} 1 5"},
		{"long provider", `grid_provider_ready{grid_provider="` + strings.Repeat("a", 257) + `"} 1 5`},
		{"long name", strings.Repeat("a", 257) + `{grid_provider="a"} 1 5`},
		{"third token", `grid_provider_ready{grid_provider="a"} 1 5 6`},
		{"unterminated", `grid_provider_ready{grid_provider="a} 1 5`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			drops, err := Parse([]byte(tc.line+"\n# comment\n\n"), func(*Stamped) { n++ })
			if err != nil || drops != 1 || n != 0 {
				t.Errorf("kept %d, drops %d, err %v", n, drops, err)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	row := func(name, provider string, v float64) *Row {
		return &Row{Name: name, Labels: []Label{{LabelProvider, provider}}, Value: v}
	}
	const ok Refusal = numRefusals // no refusal
	for _, tc := range []struct {
		r    *Row
		want Refusal
	}{
		{row(Ready, "pool-a", 1), ok},
		{row(Ready, "pool-a", 1.5), RefuseValue},
		{row(ErrorRatio, "pool-a", 2), RefuseValue},
		{row(InFlight, "pool-a", 2), ok},
		{row(InFlight, "pool-a", -1), RefuseValue},
		{row(InFlight, "pool-a", math.NaN()), RefuseValue},
		{row("go_goroutines", "pool-a", 1), RefuseName},
		{row(Ready, "Pool_A", 1), RefuseProvider},
		{row(Ready, "", 1), RefuseProvider},
	} {
		got, refused := Check(tc.r)
		if !refused {
			got = ok
		}
		if got != tc.want {
			t.Errorf("Check(%s %v %v) = %v, want %v", tc.r.Name, tc.r.Labels, tc.r.Value, got, tc.want)
		}
	}
}

func TestAgeAndBatch(t *testing.T) {
	for _, tc := range []struct {
		date, stamp, age int64
		ok               bool
	}{
		{10_000, 7_000, 3000, true},
		{10_000, 11_000, 0, true},      // within the Date's resolution
		{10_000, 12_000, -2000, false}, // 2s in the future
		{200_000_000, 200_000_000 - 2*86_400_000, 2 * 86_400_000, false},
	} {
		age, ok := AgeMs(tc.date, tc.stamp)
		if ok != tc.ok || (ok && age != tc.age) {
			t.Errorf("AgeMs(%d, %d) = %d, %v", tc.date, tc.stamp, age, ok)
		}
	}
	r := Row{Name: ConfigGeneration, Value: 7, Labels: []Label{
		{"batch_samples", "3"}, {"batch_sequence", "11"}, {LabelProvider, "m"}, {LabelSite, "b"}, {"provider_uid", "u1"}, {"publisher_epoch", "1"},
	}}
	b, ok := ParseBatch(&r)
	if !ok || b != (Batch{UID: "u1", Epoch: 1, Sequence: 11, Samples: 3, Generation: 7}) {
		t.Fatalf("ParseBatch: %+v %v", b, ok)
	}
	if !(Batch{Epoch: 1, Sequence: 10}).Before(b) || !(Batch{Epoch: 0, Sequence: 99}).Before(b) || b.Before(b) || !b.Same(b) {
		t.Error("batch ordering")
	}
	r.Labels[1].Value = "x"
	if _, ok := ParseBatch(&r); ok {
		t.Error("a bad sequence parsed")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`grid_provider_ready{grid_provider="a",grid_site="b"} 1 1787220005812` + "\n"))
	f.Add([]byte("x{"))
	f.Fuzz(func(t *testing.T, body []byte) {
		Parse(body, func(s *Stamped) {
			if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
				t.Fatalf("non-finite value kept: %v", s.Value)
			}
			if p, ok := s.Label(LabelProvider); !ok || p == "" || strings.ContainsAny(p, "/\n") {
				t.Fatalf("bad provider kept: %q", p)
			}
		})
	})
}
