package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// errNoModel is a body without a top-level string "model".
var errNoModel = errors.New("no model")

// ModelOf reads the top-level "model" of a JSON request body without
// decoding the rest: values of other keys are skipped token by token.
func ModelOf(body []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return "", err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return "", errors.New("request body is not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		key, _ := tok.(string)
		if key == "model" {
			tok, err := dec.Token()
			if err != nil {
				return "", err
			}
			m, ok := tok.(string)
			if !ok || m == "" {
				return "", errNoModel
			}
			return m, nil
		}
		if err := skipValue(dec); err != nil {
			return "", err
		}
	}
	return "", errNoModel
}

// skipValue consumes one JSON value, however deeply nested.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			if err == io.EOF {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}
