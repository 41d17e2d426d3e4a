package backend

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/grid-inference/grid/internal/config"
)

// Scrape reads one provider. An EPP is read from /metrics. An engine kind
// first asks /v1/loads (unless the memo knows it is absent) and falls back to
// /metrics by kind; a generic engine has no fallback. ready is the
// provider's current readiness: an absence found while it is not ready is
// not remembered. The returned error is classified (ClassOf).
func Scrape(ctx context.Context, t *Target, memo *ProbeMemo, ready bool, log *slog.Logger) (*Reading, error) {
	if t.Kind == config.KindEPP {
		return scrapeMetrics(ctx, t, func(body []byte) (*Reading, error) { return ParseEPP(body, t.PoolName) })
	}
	if !memo.isAbsent(t.LoadsURL) {
		r, outcome, err := probeLoads(ctx, t, log)
		switch outcome {
		case probeAvailable:
			return r, nil
		case probeAbsent:
			if ready {
				memo.markAbsent(t.LoadsURL)
			}
		case probeInconclusive:
			if t.Kind == config.KindGeneric {
				if ClassOf(err) == ClassBodyCap {
					// The engine answered: too much, but it is up.
					return bodyCapped(SourceLoads, "/v1/loads body exceeds the 1 MiB scrape budget"), nil
				}
				if err != nil {
					return nil, err
				}
				return noLoad(t.Kind), nil
			}
		}
	}
	if t.Kind == config.KindGeneric {
		return noLoad(t.Kind), nil
	}
	return scrapeMetrics(ctx, t, func(body []byte) (*Reading, error) {
		e, ok, err := ParseEngineMetrics(body, t.Kind)
		if err != nil {
			return nil, err
		}
		if !ok {
			return noLoad(t.Kind), nil
		}
		return fromEngine(t.Name, e, SourceMetrics), nil
	})
}

// probeLoads asks /v1/loads and classifies the answer three ways. Every
// discarded error is logged at debug with the provider and the reason, so a
// silent fallback or memoized absence can be explained.
func probeLoads(ctx context.Context, t *Target, log *slog.Logger) (*Reading, probeOutcome, error) {
	discard := func(outcome probeOutcome, reason string, err error) (*Reading, probeOutcome, error) {
		log.Debug("/v1/loads probe discarded", "provider", t.Name, "url", t.LoadsURL,
			"outcome", map[probeOutcome]string{probeAbsent: "absent", probeInconclusive: "inconclusive"}[outcome], "reason", reason)
		return nil, outcome, err
	}
	resp, err := t.get(ctx, t.LoadsURL, "application/json")
	if err != nil {
		return discard(probeInconclusive, err.Error(), err)
	}
	switch {
	case resp.status == http.StatusNotFound || resp.status == http.StatusMethodNotAllowed || resp.status == http.StatusNotImplemented:
		return discard(probeAbsent, http.StatusText(resp.status), nil)
	case resp.status < 200 || resp.status > 299:
		return discard(probeInconclusive, http.StatusText(resp.status), statusError(t.LoadsURL, resp.status))
	case resp.capped:
		return discard(probeInconclusive, "body exceeds 1 MiB", &Error{ClassBodyCap, errBodyCap})
	}
	lr, outcome, reason := DecodeLoads(resp.body)
	if outcome != probeAvailable {
		return discard(outcome, reason, nil)
	}
	return fromEngine(t.Name, lr.engineLoad(), SourceLoads), probeAvailable, nil
}

// scrapeMetrics GETs /metrics and parses it. A body past the cap is not a
// failure of the provider: the reading says body_cap with readiness unknown.
func scrapeMetrics(ctx context.Context, t *Target, parse func([]byte) (*Reading, error)) (*Reading, error) {
	resp, err := t.get(ctx, t.MetricsURL, Accept)
	if err != nil {
		return nil, err
	}
	if resp.status < 200 || resp.status > 299 {
		return nil, statusError(t.MetricsURL, resp.status)
	}
	if resp.capped {
		return bodyCapped(SourceMetrics, "metrics body exceeds the 1 MiB scrape budget"), nil
	}
	return parse(resp.body)
}

// bodyCapped is the reading of an answer past the body cap: the endpoint
// answered, so it is not a failure of the provider; its readiness is
// unknown, which excludes nothing (docs/protocol.md §4.3).
func bodyCapped(source, why string) *Reading {
	return &Reading{Source: source, Result: string(ClassBodyCap), Missing: why}
}
