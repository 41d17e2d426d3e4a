package readiness

import (
	"strings"
	"testing"
	"time"
)

// event is one step of a table test: a scrape outcome at t seconds.
type event struct {
	t        int
	ready    *float64 // nil: the count is unknown
	fail     string   // non-empty: the scrape failed with this class
	progress bool     // the engines answered (before this scrape)
	units    *bool    // per-unit series present (nil: treat as present)
}

func r(v float64) *float64 { return &v }
func b(v bool) *bool       { return &v }

func run(events []event) *Probe {
	var p Probe
	t0 := time.Unix(1_800_000_000, 0)
	for _, e := range events {
		now := t0.Add(time.Duration(e.t) * time.Second)
		if e.progress {
			p.Progress(now)
		}
		if e.fail != "" {
			p.Failure(now, e.fail)
			continue
		}
		c := Count{}
		if e.ready != nil {
			c = Known(*e.ready)
		}
		units := e.units == nil || *e.units
		c = p.Thaw(now, c, units)
		p.Success(now, c, "metrics reachable, but no llm_d_epp_ready_endpoints or inference_pool_ready_pods series")
	}
	return &p
}

func TestVerdicts(t *testing.T) {
	const stale = 15 * time.Second
	tests := []struct {
		name        string
		events      []event
		at          int
		unavailable bool
		want        Reason
		status      Status
		message     string
	}{
		{"never scraped", nil, 0, false, AwaitingFirstScrape, Unknown, ""},
		{"failing but within the first stale window", []event{{t: 0, fail: "connect"}}, 10, false, AwaitingFirstScrape, Unknown, ""},
		{"unavailable wins", []event{{t: 0, ready: r(3)}}, 1, true, ProviderUnavailable, False, "provider is Unavailable"},
		{"ready", []event{{t: 0, ready: r(3)}}, 1, false, Ready, True, "3 ready endpoints"},
		{"one zero is not enough", []event{{t: 0, ready: r(3)}, {t: 1, ready: r(0)}}, 1, false, Ready, True, "0 ready endpoints in the latest scrape only"},
		{"two zeros exclude", []event{{t: 0, ready: r(3)}, {t: 1, ready: r(0)}, {t: 2, ready: r(0)}}, 2, false, NoEndpointsReady, False, "0 ready endpoints for 2 or more scrapes"},
		{"two zeros while the engine answers stay ready", []event{{t: 0, ready: r(3)}, {t: 1, ready: r(0), progress: true}, {t: 2, ready: r(0)}}, 2, false, Ready, True, "0 ready endpoints, but the engine answered in the last 30s"},
		{"progress older than 30s does not count", []event{{t: 0, ready: r(3), progress: true}, {t: 31, ready: r(0)}, {t: 32, ready: r(0)}}, 32, false, NoEndpointsReady, False, ""},
		{"one good scrape after exclusion is not enough", []event{{t: 0, ready: r(0)}, {t: 1, ready: r(0)}, {t: 2, ready: r(2)}}, 2, false, NoEndpointsReady, False, "2 ready endpoints, awaiting a second scrape"},
		{"two good scrapes rejoin", []event{{t: 0, ready: r(0)}, {t: 1, ready: r(0)}, {t: 2, ready: r(2)}, {t: 3, ready: r(2)}}, 3, false, Ready, True, "2 ready endpoints"},
		{"unknown count does not exclude", []event{{t: 0, ready: nil}}, 1, false, NoLivenessCheck, Unknown, "metrics reachable, but no llm_d_epp_ready_endpoints or inference_pool_ready_pods series"},
		{"unknown resets an exclusion", []event{{t: 0, ready: r(0)}, {t: 1, ready: r(0)}, {t: 2, ready: nil}}, 2, false, NoLivenessCheck, Unknown, ""},
		{"stale without failure", []event{{t: 0, ready: r(2)}}, 16, false, MetricsStale, False, "no successful metrics scrape in the last 15s"},
		{"stale after timeouts", []event{{t: 0, ready: r(2)}, {t: 5, fail: "timeout"}}, 16, false, ScrapeTimedOut, False, "no successful metrics scrape in the last 15s; the latest failed: timeout"},
		{"stale after 401", []event{{t: 0, ready: r(2)}, {t: 5, fail: "unauthorized"}}, 16, false, ScrapeUnauthorized, False, ""},
		{"stale after tls", []event{{t: 0, ready: r(2)}, {t: 5, fail: "tls"}}, 16, false, TLSHandshakeFailed, False, ""},
		{"stale after dns", []event{{t: 0, ready: r(2)}, {t: 5, fail: "dns"}}, 16, false, ScrapeFailed, False, "the latest failed: dns"},
		{"never succeeded past the window", []event{{t: 0, fail: "connect"}}, 16, false, ScrapeFailed, False, "the latest failed: connect"},
		{"failures inside the window keep the last good", []event{{t: 0, ready: r(2)}, {t: 5, fail: "timeout"}}, 10, false, Ready, True, "2 ready endpoints"},
		{"drained pool thaws to zero", []event{{t: 0, ready: r(2)}, {t: 1, ready: r(2), units: b(false)}, {t: 2, ready: r(2), units: b(false)}}, 2, false, NoEndpointsReady, False, ""},
		{"no thaw while the engine answers", []event{{t: 0, ready: r(2)}, {t: 1, ready: r(2), units: b(false), progress: true}, {t: 2, ready: r(2), units: b(false)}}, 2, false, Ready, True, "2 ready endpoints"},
		{"no thaw when units were never seen", []event{{t: 0, ready: r(2), units: b(false)}, {t: 1, ready: r(2), units: b(false)}}, 1, false, Ready, True, ""},
	}
	t0 := time.Unix(1_800_000_000, 0)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p *Probe
			if tc.events != nil {
				p = run(tc.events)
			}
			v := p.Verdict(t0.Add(time.Duration(tc.at)*time.Second), stale, tc.unavailable)
			if v.Reason != tc.want || v.Status != tc.status {
				t.Fatalf("verdict %+v, want %s/%s", v, tc.want, tc.status)
			}
			if tc.message != "" && !strings.Contains(v.Message, tc.message) {
				t.Errorf("message %q, want it to contain %q", v.Message, tc.message)
			}
		})
	}
}

func TestExcludes(t *testing.T) {
	for r, want := range map[Reason]bool{
		Ready: false, MetricsNotConfigured: false, AwaitingFirstScrape: false, NoLivenessCheck: false,
		ProviderUnavailable: true, ScrapeTimedOut: true, ScrapeUnauthorized: true, TLSHandshakeFailed: true,
		ScrapeFailed: true, MetricsStale: true, NoEndpointsReady: true,
	} {
		if got := (Verdict{Reason: r}).Excludes(); got != want {
			t.Errorf("%s excludes = %v", r, got)
		}
	}
}

func TestStaleAfterFloor(t *testing.T) {
	for _, tc := range []struct{ configured, interval, pass, want time.Duration }{
		{15 * time.Second, time.Second, 200 * time.Millisecond, 15 * time.Second},
		{time.Second, time.Second, 200 * time.Millisecond, 2 * time.Second},
		{time.Second, time.Second, 5 * time.Second, 6 * time.Second},
	} {
		if got := StaleAfter(tc.configured, tc.interval, tc.pass); got != tc.want {
			t.Errorf("StaleAfter(%v, %v, %v) = %v, want %v", tc.configured, tc.interval, tc.pass, got, tc.want)
		}
	}
}
