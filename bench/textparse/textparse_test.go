// Package textparse_test compares the operator's filtered scanner with
// Prometheus' own scrape lexer on the same 1 MiB EPP page and the same name
// filter. It lives in its own module so that the main module does not carry
// prometheus/prometheus's dependency graph; run it with
//
//	cd bench/textparse && go test -run '^$' -bench . -benchmem -count 6
package textparse_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"

	"github.com/grid-inference/grid/internal/signals/expo"
)

var wanted = []string{
	"llm_d_epp_ready_endpoints", "inference_pool_ready_pods",
	"llm_d_epp_average_running_requests", "llm_d_epp_average_queue_size",
	"llm_d_epp_average_kv_cache_utilization", "llm_d_epp_per_endpoint_queue_size",
	"llm_d_epp_flow_control_queue_size",
}

// page is the same generator as internal/signals/expo's benchmark page.
func page(tb testing.TB) []byte {
	fixture, err := os.ReadFile("../../internal/signals/expo/testdata/epp-metrics.txt")
	if err != nil {
		tb.Fatal(err)
	}
	var b bytes.Buffer
	b.Write(fixture)
	bounds := []string{"0.005", "0.025", "0.05", "0.1", "0.2", "0.4", "0.6", "0.8", "1", "1.25", "1.5", "2", "3", "4", "5", "6", "8", "10", "15", "20", "30", "45", "60", "120", "+Inf"}
	for flow := 0; b.Len() < 1<<20; flow++ {
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

func BenchmarkScanner(b *testing.B) {
	p := page(b)
	names := expo.NewNameSet(wanted...)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		var sum float64
		expo.Scan(p, names.Has, func(s *expo.Sample) {
			if _, ok := s.Label("name"); ok {
				sum += s.Value
			}
		})
	}
}

// BenchmarkPromParserFiltered decodes labels only for wanted series, the
// cheapest honest use of textparse for this job.
func BenchmarkPromParserFiltered(b *testing.B) {
	p := page(b)
	want := map[string]bool{}
	for _, n := range wanted {
		want[n] = true
	}
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		parser := textparse.NewPromParser(p, labels.NewSymbolTable(), false)
		var sum float64
		var ls labels.Labels
		for {
			entry, err := parser.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if entry != textparse.EntrySeries {
				continue
			}
			series, _, v := parser.Series()
			name := series
			if i := bytes.IndexByte(series, '{'); i >= 0 {
				name = series[:i]
			}
			if !want[string(name)] {
				continue
			}
			parser.Labels(&ls)
			if ls.Get("name") != "" {
				sum += v
			}
		}
	}
}
