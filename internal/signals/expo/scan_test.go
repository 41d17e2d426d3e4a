package expo

import (
	"bytes"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

type line struct {
	name   string
	labels string // name=value pairs joined by ","
	value  float64
	ts     int64
	hasTS  bool
}

func scanAll(t testing.TB, body string, want func([]byte) bool) ([]line, Stats) {
	var out []line
	st, err := Scan([]byte(body), want, func(s *Sample) {
		var ls []string
		if err := s.EachLabel(func(n, v []byte) bool {
			ls = append(ls, string(n)+"="+string(v))
			return true
		}); err != nil {
			t.Fatalf("labels of %s: %v", s.Name, err)
		}
		out = append(out, line{string(s.Name), strings.Join(ls, ","), s.Value, s.Timestamp, s.HasTimestamp})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out, st
}

func all([]byte) bool { return true }

func TestScanLines(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []line
		bad  int
	}{
		{"plain", "a 1\n", []line{{"a", "", 1, 0, false}}, 0},
		{"labels and timestamp", `a{x="1",y="two"} 2.5 1700000000000` + "\n", []line{{"a", "x=1,y=two", 2.5, 1700000000000, true}}, 0},
		{"colon name", `vllm:num_requests_running{engine="0"} 14.0`, []line{{"vllm:num_requests_running", "engine=0", 14, 0, false}}, 0},
		{"escapes", `a{p="C:\\dir",q="say \"hi\"",n="l1\nl2"} 1`, []line{{"a", "p=C:\\dir,q=say \"hi\",n=l1\nl2", 1, 0, false}}, 0},
		{"brace and comma inside value", `a{x="}{,"} 3`, []line{{"a", "x=}{,", 3, 0, false}}, 0},
		{"trailing comma and spaces", `a{ x = "1" , } 4`, []line{{"a", "x=1", 4, 0, false}}, 0},
		{"special values", "a +Inf\nb -Inf\nc NaN\n", []line{{"a", "", math.Inf(1), 0, false}, {"b", "", math.Inf(-1), 0, false}, {"c", "", math.NaN(), 0, false}}, 0},
		{"exponent", "a 1.5e+07\n", []line{{"a", "", 1.5e7, 0, false}}, 0},
		{"comments and blanks", "# HELP a x\n# TYPE a gauge\n\n   \na 1\n# EOF\n", []line{{"a", "", 1, 0, false}}, 0},
		{"crlf", "a 1\r\nb 2 17\r\n", []line{{"a", "", 1, 0, false}, {"b", "", 2, 17, true}}, 0},
		{"openmetrics fractional timestamp", "a 1 1700000000.5\n", []line{{"a", "", 1, 1700000000500, true}}, 0},
		{"bad value", "a one\nb 2\n", []line{{"b", "", 2, 0, false}}, 1},
		{"unterminated labels", "a{x=\"1\" 1\nb 2\n", []line{{"b", "", 2, 0, false}}, 1},
		{"third token", "a 1 2 3\n", nil, 1},
		{"bad timestamp", "a 1 soon\n", nil, 1},
		{"no value", "a\n", nil, 1},
		{"garbage", "{}}} ===\n", nil, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, st := scanAll(t, tc.body, all)
			if st.Malformed != tc.bad {
				t.Errorf("malformed = %d, want %d", st.Malformed, tc.bad)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				same := g.name == w.name && g.labels == w.labels && g.ts == w.ts && g.hasTS == w.hasTS &&
					(g.value == w.value || (math.IsNaN(g.value) && math.IsNaN(w.value)))
				if !same {
					t.Errorf("line %d: got %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

func TestFilterSeesNameBeforeLabels(t *testing.T) {
	// An unwanted line's broken labels never matter, and are not even decoded.
	body := "skip{x=\"1\"} 1\nkeep 2\n"
	got, st := scanAll(t, body, func(n []byte) bool { return string(n) == "keep" })
	if len(got) != 1 || got[0].name != "keep" || st.Kept != 1 || st.Samples != 2 {
		t.Fatalf("got %+v, stats %+v", got, st)
	}
}

func TestNonUTF8Refused(t *testing.T) {
	if _, err := Scan([]byte("a{x=\"\xff\"} 1\n"), all, func(*Sample) {}); err == nil {
		t.Fatal("accepted non-UTF-8")
	}
}

func TestNameNormalization(t *testing.T) {
	ns := NewNameSet("vllm:num_requests_running", "sglang_token_usage")
	for _, n := range []string{"vllm:num_requests_running", "vllm_num_requests_running", "sglang:token_usage", "sglang_token_usage"} {
		if !ns.Has([]byte(n)) {
			t.Errorf("%s not matched", n)
		}
	}
	if ns.Has([]byte("vllm:num_requests_waiting")) {
		t.Error("matched an absent name")
	}
	if !NameIs([]byte("a:b"), "a_b") || NameIs([]byte("a:b"), "a_c") {
		t.Error("NameIs")
	}
}

func TestTypesAfterSamples(t *testing.T) {
	body := "a 1\n# TYPE a gauge\n# TYPE sglang:b counter\nsglang:b_total 2\n"
	ty := Types([]byte(body))
	if ty["a"] != "gauge" || ty["sglang_b"] != "counter" {
		t.Fatalf("types %v", ty)
	}
}

// TestAgreesWithExpfmt: on every fixture, the scanner finds the same samples
// (name, labels, value) as the reference parser.
func TestAgreesWithExpfmt(t *testing.T) {
	for _, f := range []string{"epp-metrics.txt", "vllm-metrics.txt", "sglang-metrics.txt", "llm-d-inference-sim-metrics.txt"} {
		t.Run(f, func(t *testing.T) {
			body, err := os.ReadFile("testdata/" + f)
			if err != nil {
				t.Fatal(err)
			}
			ours := map[string]float64{}
			_, err = Scan(body, all, func(s *Sample) {
				var ls []string
				s.EachLabel(func(n, v []byte) bool {
					val := string(v)
					if string(n) == "le" || string(n) == "quantile" {
						if f, err := strconv.ParseFloat(val, 64); err == nil {
							val = canonical(f)
						}
					}
					ls = append(ls, string(n)+"="+val)
					return true
				})
				ours[string(s.Name)+"{"+strings.Join(sortedCopy(ls), ",")+"}"] = s.Value
			})
			if err != nil {
				t.Fatal(err)
			}
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			theirs := 0
			for _, fam := range fams {
				for _, m := range fam.Metric {
					for name, v := range expand(fam.GetName(), m) {
						theirs++
						if got, ok := ours[name]; !ok || (got != v && !(math.IsNaN(got) && math.IsNaN(v))) {
							t.Errorf("%s: expfmt %v, scanner %v (found %v)", name, v, got, ok)
						}
					}
				}
			}
			if theirs != len(ours) || theirs == 0 {
				t.Errorf("expfmt saw %d samples, scanner %d", theirs, len(ours))
			}
		})
	}
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	for i := 1; i < len(c); i++ {
		for j := i; j > 0 && c[j] < c[j-1]; j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
	return c
}

// expand turns one parsed metric back into its sample lines, keyed as
// TestAgreesWithExpfmt keys the scanner's.
func expand(name string, m *dto.Metric) map[string]float64 {
	base := func(extra ...string) string {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		ls = append(ls, extra...)
		return "{" + strings.Join(sortedCopy(ls), ",") + "}"
	}
	out := map[string]float64{}
	switch {
	case m.Histogram != nil:
		h := m.Histogram
		for _, b := range h.GetBucket() {
			out[name+"_bucket"+base("le="+canonical(b.GetUpperBound()))] = float64(b.GetCumulativeCount())
		}
		out[name+"_bucket"+base("le=+Inf")] = float64(h.GetSampleCount())
		out[name+"_sum"+base()] = h.GetSampleSum()
		out[name+"_count"+base()] = float64(h.GetSampleCount())
	case m.Summary != nil:
		for _, q := range m.Summary.GetQuantile() {
			out[name+base("quantile="+canonical(q.GetQuantile()))] = q.GetValue()
		}
		out[name+"_sum"+base()] = m.Summary.GetSampleSum()
		out[name+"_count"+base()] = float64(m.Summary.GetSampleCount())
	case m.Gauge != nil:
		out[name+base()] = m.Gauge.GetValue()
	case m.Counter != nil:
		out[name+base()] = m.Counter.GetValue()
	case m.Untyped != nil:
		out[name+base()] = m.Untyped.GetValue()
	}
	return out
}

func canonical(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
