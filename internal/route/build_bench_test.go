package route

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/loadstore"
	"github.com/grid-inference/grid/internal/signals"
)

// BenchmarkBuild rebuilds the snapshot of a grid of sites × providers, each
// holding a window of samples, as the gateway does after every poll.
func BenchmarkBuild(b *testing.B) {
	for _, size := range []struct{ sites, providers int }{{8, 4}, {64, 64}} {
		b.Run(fmt.Sprintf("sites=%d/providers=%d", size.sites, size.providers), func(b *testing.B) {
			store := loadstore.New(time.Minute)
			var cands []Candidate
			const now = 1_000_000
			for s := range size.sites {
				site := fmt.Sprintf("s%02d", s)
				var body strings.Builder
				for p := range size.providers {
					prov := fmt.Sprintf("p%02d", p)
					cands = append(cands, Candidate{Model: fmt.Sprintf("m%d", p%4), Site: site, Provider: prov, Upstream: &url.URL{Host: site}})
					for k := range 5 { // five polls' worth of samples
						ts := int64(now - 4000 + k*1000)
						lbl := fmt.Sprintf(`grid_provider=%q,grid_site=%q`, prov, site)
						fmt.Fprintf(&body, "llm_d_epp_average_running_requests{%s,name=\"x\"} %d %d\n", lbl, (s+p+k)%9, ts)
						fmt.Fprintf(&body, "llm_d_epp_average_queue_size{%s,name=\"x\"} %d %d\n", lbl, (s+k)%2, ts)
						fmt.Fprintf(&body, "llm_d_epp_ready_endpoints{%s,name=\"x\"} 2 %d\n", lbl, ts)
						fmt.Fprintf(&body, "llm_d_epp_per_endpoint_queue_size{%s,model_server_endpoint=\"e\",name=\"x\"} 1 %d\n", lbl, ts)
					}
				}
				store.Ingest([]byte(body.String()), now, now, now, signals.Origin{Site: site, Relay: true})
			}
			builder := NewBuilder(NewAgeAware(&Service{}, AgeAwareOptions{}))
			set := DefaultSettings
			b.ReportAllocs()
			t := int64(now)
			for b.Loop() {
				t += 1000
				builder.Build(store, cands, t, nil, set)
			}
		})
	}
}
