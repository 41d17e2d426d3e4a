package gateway

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

func TestModelOf(t *testing.T) {
	for _, tc := range []struct {
		body, want string
		ok         bool
	}{
		{`{"model":"Qwen/Qwen3-8B","messages":[]}`, "Qwen/Qwen3-8B", true},
		{`{"messages":[{"role":"user","content":"{\"model\":\"no\"}"}],"stream":true,"model":"m2"}`, "m2", true},
		{`{"nested":{"model":"inner"},"model":"outer"}`, "outer", true},
		{`{"messages":[]}`, "", false},
		{`{"model":7}`, "", false},
		{`{"model":""}`, "", false},
		{`[{"model":"m"}]`, "", false},
		{`{"model":`, "", false},
		{``, "", false},
	} {
		got, err := ModelOf([]byte(tc.body))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ModelOf(%s) = %q, %v", tc.body, got, err)
		}
	}
}

func FuzzModelOf(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"content":"x"}]}`))
	f.Add([]byte(`{"a":[[[[{}]]]],"model":"m"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := ModelOf(body)
		if err == nil && m == "" {
			t.Fatal("empty model without an error")
		}
	})
}

// TestRefusalTableIsDocumented: every refusal the gateway answers is a row
// of docs/gateway.md's refusal table, with its status, type, code and
// whether it carries Retry-After; and the table has no other row.
func TestRefusalTableIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| [^|]+ \\| (\\d{3}) \\| `([a-z_]+)` \\| `([a-z_]+)` \\| (no|3–7 s[^|]*) \\|$")
	documented := map[string]apiError{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		status, _ := strconv.Atoi(m[1])
		documented[m[3]] = apiError{Status: status, Type: m[2], Code: m[3], Retryable: m[4] != "no"}
	}
	for _, e := range apiErrors {
		d, ok := documented[e.Code]
		if !ok {
			t.Errorf("refusal %s is not in docs/gateway.md's table", e.Code)
			continue
		}
		if d.Status != e.Status || d.Type != e.Type || d.Retryable != e.Retryable {
			t.Errorf("docs/gateway.md says %s is %d %s retryable=%v; the gateway answers %d %s retryable=%v",
				e.Code, d.Status, d.Type, d.Retryable, e.Status, e.Type, e.Retryable)
		}
		delete(documented, e.Code)
	}
	for code := range documented {
		t.Errorf("docs/gateway.md documents %s, which the gateway never answers", code)
	}
}
