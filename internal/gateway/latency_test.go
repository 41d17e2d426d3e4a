package gateway_test

import (
	"sync"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/config"
)

// TestLatencyPolicyStaysLocalAcrossTheRoundTrip: two sites of 8 slots whose
// hops are behind links of 40 ms each way (real listeners, mutual TLS,
// operators peering). East's gateway measures the round trip to west
// (GET /v1/grid/ping, about 80 ms); under the latency policy, 4 clients
// sending streams back to back to east are served by east, which has room,
// where the age-aware policy splits them by load.
func TestLatencyPolicyStaysLocalAcrossTheRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("two sites of real listeners")
	}
	for _, tc := range []struct {
		policy    string
		leastEast float64
		mostEast  float64
	}{{config.PolicyLatency, 0.85, 1}, {config.PolicyAgeAware, 0, 0.75}} {
		t.Run(tc.policy, func(t *testing.T) {
			g := startGrid(t, gridSpec{slots: map[string]int{"east": 8, "west": 8}, policy: tc.policy, hopDelay: 40 * time.Millisecond})
			east := g["east"]
			rtt := func() float64 {
				for _, c := range east.gw.View().Sites {
					if c.Site == "west" && c.RoundTripMs != nil {
						return *c.RoundTripMs
					}
				}
				return 0
			}
			// Requests keep east's gateway busy: an idle one probes nothing.
			waitUntil(t, 20*time.Second, "east measures the round trip to west", func() bool {
				postChat(east.client, 1, false)
				ms := rtt()
				return ms >= 70 && ms < 500
			})
			// Four clients back to back: 5 requests each while the
			// gateway learns what they cost and how long they hold a
			// slot (some cross the round trip then), then 15 counted.
			clients := func(each int) map[string]int {
				var mu sync.Mutex
				served := map[string]int{}
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for range each {
							resp, _, err := postChat(east.client, 4, true)
							if err != nil || resp.StatusCode != 200 {
								continue
							}
							mu.Lock()
							served[resp.Header.Get("X-Grid-Site")]++
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				return served
			}
			learning := clients(5)
			served := clients(15)
			t.Logf("%s: while learning, served %v", tc.policy, learning)
			total := served["east"] + served["west"]
			share := float64(served["east"]) / float64(max(total, 1))
			t.Logf("%s: served %v (east %.2f), round trip to west %.0f ms", tc.policy, served, share, rtt())
			if total < 55 || share < tc.leastEast || share > tc.mostEast {
				t.Errorf("%s: east served %.2f of %d, want within [%.2f, %.2f]", tc.policy, share, total, tc.leastEast, tc.mostEast)
			}
		})
	}
}
