package gateway

import "testing"

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
