package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
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
	if !json.Valid(body) {
		return "", errInvalidJSON
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return "", errInvalidJSON
	}
	i++
	var model string
	found := false
	for {
		i = skipSpace(body, i)
		switch body[i] {
		case '}':
			if !found || model == "" {
				return "", errNoModel
			}
			return model, nil
		case ',':
			i = skipSpace(body, i+1)
		}
		keyEnd := stringEnd(body, i)
		key := body[i:keyEnd]
		i = skipSpace(body, keyEnd) + 1 // the ':'
		i = skipSpace(body, i)
		valueEnd := valueEnd(body, i)
		if isModelKey(key) {
			if found {
				return "", errAmbiguousModel
			}
			found = true
			if body[i] == '"' {
				if err := json.Unmarshal(body[i:valueEnd], &model); err != nil {
					return "", errInvalidJSON
				}
			}
		}
		i = valueEnd
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
