package expo

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// eppPage builds a deterministic EPP-shaped exposition of about size bytes:
// the fixture's families, with the fairness-id cardinality a busy EPP without
// --fairness-id-metric-label-limit grows (request histograms per flow).
func eppPage(tb testing.TB, size int) []byte {
	fixture, err := os.ReadFile("testdata/epp-metrics.txt")
	if err != nil {
		tb.Fatal(err)
	}
	var b bytes.Buffer
	b.Write(fixture)
	bounds := []string{"0.005", "0.025", "0.05", "0.1", "0.2", "0.4", "0.6", "0.8", "1", "1.25", "1.5", "2", "3", "4", "5", "6", "8", "10", "15", "20", "30", "45", "60", "120", "+Inf"}
	for flow := 0; b.Len() < size; flow++ {
		ls := fmt.Sprintf(`fairness_id="tenant-%05d",model_name="Qwen/Qwen3-8B",priority="0",target_model_name="Qwen/Qwen3-8B"`, flow)
		for i, le := range bounds {
			fmt.Fprintf(&b, "llm_d_epp_request_ttft_seconds_bucket{%s,streaming=\"true\",le=\"%s\"} %d\n", ls, le, i*7)
		}
		fmt.Fprintf(&b, "llm_d_epp_request_ttft_seconds_sum{%s,streaming=\"true\"} 12.5\n", ls)
		fmt.Fprintf(&b, "llm_d_epp_request_ttft_seconds_count{%s,streaming=\"true\"} 168\n", ls)
		fmt.Fprintf(&b, "llm_d_epp_request_total{%s} 170\n", ls)
		fmt.Fprintf(&b, "llm_d_epp_inflight_requests{endpoint_name=\"ep-%d\",fairness_id=\"tenant-%05d\",namespace=\"llm-d\",priority=\"0\",producer_name=\"inflight-load-producer\"} 1\n", flow%8, flow)
	}
	return b.Bytes()
}

// The pool gauges the operator keeps from an EPP page.
var benchNames = NewNameSet(
	"llm_d_epp_ready_endpoints", "inference_pool_ready_pods",
	"llm_d_epp_average_running_requests", "llm_d_epp_average_queue_size",
	"llm_d_epp_average_kv_cache_utilization", "llm_d_epp_per_endpoint_queue_size",
	"llm_d_epp_flow_control_queue_size",
)

func BenchmarkScanEPP(b *testing.B) {
	page := eppPage(b, 1<<20)
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	var sum float64
	for b.Loop() {
		_, err := Scan(page, benchNames.Has, func(s *Sample) {
			if _, ok := s.Label("name"); ok {
				sum += s.Value
			}
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if sum == 0 {
		b.Fatal("nothing kept")
	}
}

func BenchmarkExpfmtEPP(b *testing.B) {
	page := eppPage(b, 1<<20)
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
		if err != nil {
			b.Fatal(err)
		}
		if fams["llm_d_epp_ready_endpoints"] == nil {
			b.Fatal("missing")
		}
	}
}

func TestBenchPageIsSane(t *testing.T) {
	page := eppPage(t, 1<<20)
	if len(page) < 1<<20 {
		t.Fatalf("page is %d bytes", len(page))
	}
	st, err := Scan(page, benchNames.Has, func(*Sample) {})
	if err != nil || st.Malformed != 0 || st.Kept < 7 {
		t.Fatalf("stats %+v, err %v", st, err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		Scan(page, benchNames.Has, func(s *Sample) { s.Label("name") })
	})
	// One allocation per scan: the Sample handed to the callback escapes.
	if allocs > 1 {
		t.Errorf("scanning a 1 MiB page allocates %v times", allocs)
	}
}

func FuzzScan(f *testing.F) {
	for _, file := range []string{"epp-metrics.txt", "sglang-metrics-openmetrics-underscores.txt"} {
		b, _ := os.ReadFile("testdata/" + file)
		f.Add(b[:min(len(b), 4096)])
	}
	f.Add([]byte(`a{x="\"}"} 1 2` + "\n"))
	f.Add([]byte("a{"))
	f.Fuzz(func(t *testing.T, body []byte) {
		st, err := Scan(body, func([]byte) bool { return true }, func(s *Sample) {
			s.EachLabel(func(n, v []byte) bool { return true })
			s.Label("le")
		})
		if err == nil && st.Kept != st.Samples {
			t.Fatalf("kept %d of %d with an accept-all filter", st.Kept, st.Samples)
		}
		Types(body)
	})
}
