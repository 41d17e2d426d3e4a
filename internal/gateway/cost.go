package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grid-inference/grid/internal/route"
)

// What a request will cost an engine, estimated from its body without a
// tokenizer (docs/gateway.md, request cost): the prompt it must prefill
// and the most it may generate.

// promptBytesPerToken is the rule for a prompt given as text: its JSON's
// bytes over four. English runs about four characters a token in the
// tokenizers of the common open models; the JSON of a chat's messages
// adds its keys and roles, a few tokens a message, about what the chat
// template adds. Text in other scripts (three UTF-8 bytes a character)
// is read a little light.
const promptBytesPerToken = 4

// A request's estimated size is a route.Cost: its Prompt a prompt of token
// IDs counted exactly, one of text by promptBytesPerToken, rounded up (0
// when the body has none); its MaxOutput the request's own limit on what
// it generates (max_completion_tokens, else max_tokens, else
// max_output_tokens; 0 when it sets none).

// promptTokens estimates the tokens of a prompt's JSON value (a chat's
// messages, a completion's prompt, an embedding's or a response's
// input): an array of integers, or of arrays of integers, is token IDs,
// counted; anything else is text, weighed by its bytes.
func promptTokens(v []byte) int {
	if n, ok := tokenIDs(v, 2); ok {
		return n
	}
	return (len(v) + promptBytesPerToken - 1) / promptBytesPerToken
}

// tokenIDs counts the integers of an array of integers, or of arrays of
// them (a batch of prompts), nested at most depth deep; ok is false for
// any other value. The bound keeps a body of nested brackets from costing
// a scan per level.
func tokenIDs(v []byte, depth int) (n int, ok bool) {
	if depth == 0 || len(v) == 0 || v[0] != '[' {
		return 0, false
	}
	for i := 1; ; {
		i = skipSpace(v, i)
		if i >= len(v) {
			return 0, false
		}
		switch c := v[i]; {
		case c == ']':
			return n, n > 0
		case c == ',':
			i++
			continue
		case c == '[':
			end := valueEnd(v, i)
			m, ok := tokenIDs(v[i:end], depth-1)
			if !ok {
				return 0, false
			}
			n, i = n+m, end
		case c >= '0' && c <= '9':
			end := valueEnd(v, i)
			for _, d := range v[i:end] {
				if d < '0' || d > '9' {
					return 0, false // a fraction or an exponent: not an ID
				}
			}
			n, i = n+1, end
		default:
			return 0, false
		}
	}
}

// tokenLimit reads a request's output limit: an integer of at most nine
// digits, or 0 for anything else (a negative, a fraction, a string,
// null), without allocating.
func tokenLimit(v []byte) int {
	if len(v) == 0 || len(v) > 9 {
		return 0
	}
	n := 0
	for _, d := range v {
		if d < '0' || d > '9' {
			return 0
		}
		n = 10*n + int(d-'0')
	}
	return n
}

// Bound observers of grid_gateway_request_tokens, so counting a request
// looks nothing up.
type costObservers struct{ prompt, maxOutput prometheus.Observer }

// countCost observes a client request's estimated size.
func (g *Gateway) countCost(c route.Cost) {
	if c.Prompt > 0 {
		g.costs.prompt.Observe(float64(c.Prompt))
	}
	if c.MaxOutput > 0 {
		g.costs.maxOutput.Observe(float64(c.MaxOutput))
	}
}
