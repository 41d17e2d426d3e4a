// Package readiness decides whether a provider can serve, from the history
// of its scrapes (docs/protocol.md §4.3): two-scrape streaks both ways, the 30s
// engine-progress window, drained-pool thaw, the stale window, and the
// provider's own Unavailable flag. The verdict is published as
// grid_provider_ready and explained by a reason.
package readiness

import (
	"fmt"
	"time"
)

// Streak is how many consecutive scrapes flip readiness either way.
const Streak = 2

// ProgressWindow is how recent an engine answer (or a per-unit series) must
// be to count.
const ProgressWindow = 30 * time.Second

// Reason names why a verdict is what it is. The strings are part of the
// external contract (Ready conditions, logs, grid status).
type Reason string

// Reasons.
const (
	Ready                Reason = "Ready"
	AwaitingFirstScrape  Reason = "AwaitingFirstScrape"
	ProviderUnavailable  Reason = "ProviderUnavailable"
	ScrapeTimedOut       Reason = "ScrapeTimedOut"
	ScrapeUnauthorized   Reason = "ScrapeUnauthorized"
	TLSHandshakeFailed   Reason = "TLSHandshakeFailed"
	ScrapeFailed         Reason = "ScrapeFailed"
	MetricsStale         Reason = "MetricsStale"
	NoEndpointsReady     Reason = "NoEndpointsReady"
	NoLivenessCheck      Reason = "NoLivenessCheck"
	MetricsNotConfigured Reason = "MetricsNotConfigured"
)

// Status is the condition status of a verdict.
type Status string

// Statuses.
const (
	True    Status = "True"
	False   Status = "False"
	Unknown Status = "Unknown"
)

// Verdict is a readiness decision.
type Verdict struct {
	Reason  Reason
	Status  Status
	Message string
}

// Excludes reports whether the verdict takes the provider out of routing:
// every reason but Ready, MetricsNotConfigured, AwaitingFirstScrape and
// NoLivenessCheck.
func (v Verdict) Excludes() bool {
	switch v.Reason {
	case Ready, MetricsNotConfigured, AwaitingFirstScrape, NoLivenessCheck:
		return false
	}
	return true
}

// Count is an optional ready-endpoint count.
type Count struct {
	Value float64
	Known bool
}

// Known returns a known count.
func Known(v float64) Count { return Count{v, true} }

// Probe is one provider's scrape history as readiness sees it.
type Probe struct {
	firstAttempt  time.Time
	lastGood      time.Time
	ready         Count // from the last good scrape
	failure       string
	missing       string
	zeroStreak    int
	readyStreak   int
	noEndpoints   bool
	busy          bool
	lastProgress  time.Time
	unitsLastSeen time.Time
}

// Progress records that the engines answered requests at now.
func (p *Probe) Progress(now time.Time) { p.lastProgress = now }

// Thaw applies the drained-pool rule to a scrape's ready count: an EPP whose
// per-unit series stopped (they were seen in the last 30s, none now) while
// its ready gauge still reads ≥ 1 and no engine answered in 30s has drained
// and frozen its gauges, so the count is read as 0. unitsReporting marks a
// scrape that carried per-unit series; it is recorded here.
func (p *Probe) Thaw(now time.Time, ready Count, unitsReporting bool) Count {
	if unitsReporting {
		p.unitsLastSeen = now
		return ready
	}
	if ready.Known && ready.Value >= 1 && within(now, p.unitsLastSeen, ProgressWindow) && !within(now, p.lastProgress, ProgressWindow) {
		return Known(0)
	}
	return ready
}

func within(now, t time.Time, d time.Duration) bool { return !t.IsZero() && now.Sub(t) <= d }

// Success records a scrape that answered. missing explains an unknown
// count ("metrics reachable, but no … series"), or a count of 0 the
// scrape concluded rather than read (an EPP that serves other pools).
func (p *Probe) Success(now time.Time, ready Count, missing string) {
	if p.firstAttempt.IsZero() {
		p.firstAttempt = now
	}
	switch {
	case !ready.Known:
		p.zeroStreak, p.readyStreak = 0, 0
		p.busy, p.noEndpoints = false, false
	case ready.Value < 1:
		p.zeroStreak++
		p.readyStreak = 0
		p.busy = within(now, p.lastProgress, ProgressWindow)
		p.noEndpoints = (p.noEndpoints || p.zeroStreak >= Streak) && !p.busy
		if p.noEndpoints {
			p.unitsLastSeen = time.Time{}
		}
	default:
		p.readyStreak++
		p.zeroStreak = 0
		p.busy = false
		p.noEndpoints = p.noEndpoints && p.readyStreak < Streak
	}
	p.lastGood = now
	p.failure = ""
	p.ready = ready
	p.missing = missing
}

// Failure records a scrape that failed with a class (timeout, tls, ...).
// Everything learned from earlier scrapes is kept.
func (p *Probe) Failure(now time.Time, class string) {
	if p.firstAttempt.IsZero() {
		p.firstAttempt = now
	}
	p.failure = class
}

// ReadyEndpoints returns the count of the last good scrape.
func (p *Probe) ReadyEndpoints() Count {
	if p == nil {
		return Count{}
	}
	return p.ready
}

// Verdict decides at now. staleAfter is the stale window; unavailable is the
// provider's own out-of-service flag. A nil probe has never been scraped.
func (p *Probe) Verdict(now time.Time, staleAfter time.Duration, unavailable bool) Verdict {
	if unavailable {
		return Verdict{ProviderUnavailable, False, "provider is Unavailable"}
	}
	if p == nil || (p.lastGood.IsZero() && now.Sub(p.firstAttempt) <= staleAfter) {
		return Verdict{AwaitingFirstScrape, Unknown, "awaiting the first metrics scrape"}
	}
	secs := int(staleAfter.Round(time.Second) / time.Second)
	if p.lastGood.IsZero() || now.Sub(p.lastGood) > staleAfter {
		if p.failure == "" {
			return Verdict{MetricsStale, False, fmt.Sprintf("no successful metrics scrape in the last %ds", secs)}
		}
		return Verdict{failureReason(p.failure), False,
			fmt.Sprintf("no successful metrics scrape in the last %ds; the latest failed: %s", secs, p.failure)}
	}
	if p.noEndpoints {
		msg := fmt.Sprintf("%g ready endpoints, awaiting a second scrape", p.ready.Value)
		if p.zeroStreak >= Streak {
			msg = fmt.Sprintf("0 ready endpoints for %d or more scrapes", Streak)
		}
		if p.missing != "" {
			msg += ": " + p.missing
		}
		return Verdict{NoEndpointsReady, False, msg}
	}
	if !p.ready.Known {
		return Verdict{NoLivenessCheck, Unknown, p.missing}
	}
	switch {
	case p.ready.Value >= 1:
		return Verdict{Ready, True, fmt.Sprintf("%g ready endpoints", p.ready.Value)}
	case p.busy:
		return Verdict{Ready, True, "0 ready endpoints, but the engine answered in the last 30s"}
	default:
		return Verdict{Ready, True, "0 ready endpoints in the latest scrape only"}
	}
}

func failureReason(class string) Reason {
	switch class {
	case "timeout":
		return ScrapeTimedOut
	case "unauthorized":
		return ScrapeUnauthorized
	case "tls":
		return TLSHandshakeFailed
	default:
		return ScrapeFailed
	}
}

// StaleAfter is the stale window: the configured one, but never below the
// readiness floor of one interval plus the longer of one interval or the
// provider's latest measured scrape cycle (its tick to its scrape's end, a
// wait for a place among the scrapes in flight included), so a good sample
// stays valid until the next scrape can refresh it.
func StaleAfter(configured, interval, lastCycle time.Duration) time.Duration {
	return max(configured, interval+max(interval, lastCycle))
}
