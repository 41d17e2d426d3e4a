package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"

	"github.com/grid-inference/grid/internal/route"
)

// Why a request body names no usable model.
var (
	// errNoModel is a JSON object without a top-level string "model".
	errNoModel = errors.New("no model")
	// errInvalidJSON is a body that is not JSON, or not a JSON object.
	errInvalidJSON = errors.New("the request body is not a JSON object")
	// errAmbiguousModel is an object with "model" twice at the top level
	// (however its key is escaped): the gateway would route on one and the
	// engine might serve the other.
	errAmbiguousModel = errors.New(`the request body names "model" more than once`)
)

// ModelOf reads the top-level "model" of a JSON request body without
// decoding the rest. The body must be valid JSON and an object, and must
// name "model" at most once at the top level; values of other keys are
// skipped without allocating.
func ModelOf(body []byte) (string, error) {
	head, err := parseRequest(body)
	return head.model, err
}

// requestHead is what the gateway reads of a request body.
type requestHead struct {
	model string
	// prompt is the leading part of the prompt that prefix affinity hashes
	// (promptHead); nil when the body has none.
	prompt []byte
	// stream: the body asks for a stream ("stream": true), the only
	// answers that may be detached (detach.go).
	stream bool
	// cost is the request's estimated size (cost.go).
	cost route.Cost
}

// parseRequest reads a request body's model (as ModelOf) and, in the same
// pass, its prompt's head and whether it asks for a stream.
func parseRequest(body []byte) (head requestHead, err error) {
	if !json.Valid(body) {
		return requestHead{}, errInvalidJSON
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return requestHead{}, errInvalidJSON
	}
	i++
	found := false
	// limits are the output limits in the order they win: OpenAI's
	// max_completion_tokens supersedes max_tokens; the Responses API
	// names it max_output_tokens.
	var limits [3]int
	for {
		i = skipSpace(body, i)
		switch body[i] {
		case '}':
			for _, l := range limits {
				if l > 0 {
					head.cost.MaxOutput = l
					break
				}
			}
			if !found || head.model == "" {
				return head, errNoModel // the model may come from a header
			}
			return head, nil
		case ',':
			i = skipSpace(body, i+1)
		}
		keyEnd := stringEnd(body, i)
		key := body[i:keyEnd]
		i = skipSpace(body, keyEnd) + 1 // the ':'
		i = skipSpace(body, i)
		valueEnd := valueEnd(body, i)
		switch {
		case isModelKey(key):
			if found {
				return requestHead{}, errAmbiguousModel
			}
			found = true
			if body[i] == '"' {
				model, err := jsonString(body[i:valueEnd])
				if err != nil {
					return requestHead{}, errInvalidJSON
				}
				head.model = model
			}
		case head.prompt == nil && (string(key) == `"messages"` || string(key) == `"prompt"` || string(key) == `"input"`):
			head.prompt = promptHead(body[i:valueEnd])
			head.cost.Prompt = promptTokens(body[i:valueEnd])
		case string(key) == `"stream"`:
			head.stream = string(body[i:valueEnd]) == "true"
		case string(key) == `"max_completion_tokens"`:
			limits[0] = tokenLimit(body[i:valueEnd])
		case string(key) == `"max_tokens"`:
			limits[1] = tokenLimit(body[i:valueEnd])
		case string(key) == `"max_output_tokens"`:
			limits[2] = tokenLimit(body[i:valueEnd])
		}
		i = valueEnd
	}
}

// promptHead is the part of a prompt that stays the same over a
// conversation's turns: of a chat's messages, the array up to the end of
// its first user message (the system prompt and the first question); of a
// completion's prompt or an embedding's input, the whole value. A chat
// resends the same leading messages, serialised the same way, on every
// turn; what follows grows.
func promptHead(v []byte) []byte {
	if len(v) == 0 || v[0] != '[' {
		return v
	}
	i := 1
	for {
		i = skipSpace(v, i)
		if i >= len(v) || v[i] == ']' {
			return v
		}
		if v[i] == ',' {
			i = skipSpace(v, i+1)
		}
		end := valueEnd(v, i)
		if v[i] == '{' && isUserMessage(v[i:end]) {
			return v[:end]
		}
		i = end
	}
}

// isUserMessage reports whether a message object's top-level "role" is
// "user".
func isUserMessage(obj []byte) bool {
	i := 1
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] == '}' {
			return false
		}
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
		keyEnd := stringEnd(obj, i)
		key := obj[i:keyEnd]
		i = skipSpace(obj, skipSpace(obj, keyEnd)+1)
		end := valueEnd(obj, i)
		if string(key) == `"role"` {
			return string(obj[i:end]) == `"user"`
		}
		i = end
	}
}

// isModelKey reports whether a quoted JSON key is "model", escapes read.
func isModelKey(quoted []byte) bool {
	if bytes.IndexByte(quoted, '\\') < 0 {
		return string(quoted) == `"model"`
	}
	var key string
	return json.Unmarshal(quoted, &key) == nil && key == "model"
}

// The scanners below run on a body json.Valid accepted, so they need not
// check its grammar.

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string that starts at i.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// valueEnd returns the index just past the value that starts at i.
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return len(b)
}

// jsonString decodes a JSON string token, quotes included, as
// encoding/json does. A plain one (no escape, valid UTF-8: every model
// name in practice) is its bytes between the quotes, without the decoder
// a json.Unmarshal call costs on every request.
func jsonString(tok []byte) (string, error) {
	if len(tok) >= 2 {
		if v := tok[1 : len(tok)-1]; bytes.IndexByte(v, '\\') < 0 && utf8.Valid(v) {
			return string(v), nil
		}
	}
	var s string
	err := json.Unmarshal(tok, &s)
	return s, err
}
