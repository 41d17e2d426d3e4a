package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// apiError is one refusal the gateway answers: an OpenAI-style JSON error
// (`{"error":{"message","type","code"}}`). Every refusal comes from the
// table below, which docs/gateway.md lists row for row (a test keeps the two
// the same).
type apiError struct {
	Status int
	// Type is the OpenAI error type, Code the machine-readable reason.
	Type, Code string
	// Retryable answers carry Retry-After: the same request may succeed
	// later, elsewhere or when load falls.
	Retryable bool
	Message   string
}

// The refusals, in the order docs/gateway.md lists them.
var (
	errModelRequired       = apiError{http.StatusBadRequest, "invalid_request_error", "model_required", false, `the request names no model (a top-level "model" or an X-Model header)`}
	errBadBody             = apiError{http.StatusBadRequest, "invalid_request_error", "bad_request", false, "could not read the request body"}
	errTooLarge            = apiError{http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", false, "request body exceeds 10 MiB"}
	errBodyTimeout         = apiError{http.StatusRequestTimeout, "invalid_request_error", "request_timeout", false, "the request body did not arrive in time"}
	errShed                = apiError{http.StatusTooManyRequests, "rate_limit_exceeded", "capacity_exhausted", true, "every site serving this model is at capacity"}
	errNoHealthySite       = apiError{http.StatusServiceUnavailable, "server_error", "no_healthy_site", true, "no healthy site serves this model now"}
	errModelNotFound       = apiError{http.StatusNotFound, "invalid_request_error", "model_not_found", false, "no site serves this model"}
	errNoRoute             = apiError{http.StatusNotFound, "invalid_request_error", "no_route", false, "no route serves this model"}
	errUpstreamUnreachable = apiError{http.StatusBadGateway, "server_error", "upstream_unreachable", true, "the chosen site could not be reached"}
	errUpstreamFailed      = apiError{http.StatusBadGateway, "server_error", "upstream_error", false, "the upstream failed to answer"}
	errHopForbidden        = apiError{http.StatusForbidden, "permission_error", "forbidden", false, "only a grid site may forward requests here"}
	errOperatorUnreachable = apiError{http.StatusServiceUnavailable, "server_error", "operator_unreachable", true, "the gateway has not read its site's operator yet"}
	apiInvalidJSON         = apiError{http.StatusBadRequest, "invalid_request_error", "invalid_json", false, "the request body is not a JSON object"}
	apiAmbiguousModel      = apiError{http.StatusBadRequest, "invalid_request_error", "ambiguous_model", false, `the request body names "model" more than once`}
	errUnknownURL          = apiError{http.StatusNotFound, "invalid_request_error", "unknown_url", false, "no such API path"}
	errBodyBudget          = apiError{http.StatusServiceUnavailable, "server_error", "body_budget", true, "the gateway holds as many request bodies as it may; retry shortly"}
	errMethodNotAllowed    = apiError{http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", false, "this API path does not take this method"}
	errShuttingDown        = apiError{http.StatusServiceUnavailable, "server_error", "shutting_down", true, "the gateway's drain ran out of time before the upstream answered; retry"}
)

// apiErrors lists every refusal, for the documentation test.
var apiErrors = []apiError{
	errModelRequired, errBadBody, errTooLarge, errBodyTimeout, errShed, errNoHealthySite,
	errModelNotFound, errNoRoute, errUpstreamUnreachable, errUpstreamFailed, errHopForbidden, errOperatorUnreachable,
	apiInvalidJSON, apiAmbiguousModel, errUnknownURL, errMethodNotAllowed, errBodyBudget, errShuttingDown,
}

// about is e with a message that names what the refusal is about (the model
// asked for, the site tried), so that a client's log says it without the
// request beside it. The table's message is the generic form.
func (e apiError) about(format string, args ...any) apiError {
	e.Message = fmt.Sprintf(format, args...)
	return e
}

// retryAfter spreads clients' retries over 3 to 7 seconds.
var retryAfter = [...]string{"3", "4", "5", "6", "7"}

// write answers e; turn spreads Retry-After across requests.
func (e apiError) write(w http.ResponseWriter, turn uint64) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.Retryable {
		h.Set("Retry-After", retryAfter[turn%uint64(len(retryAfter))])
	}
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": e.Message, "type": e.Type, "code": e.Code}})
}
