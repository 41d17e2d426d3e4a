package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/route"
	"github.com/grid-inference/grid/internal/sim"
)

func TestModelOf(t *testing.T) {
	for _, tc := range []struct {
		body, want string
		err        error
	}{
		{`{"model":"Qwen/Qwen3-8B","messages":[]}`, "Qwen/Qwen3-8B", nil},
		{`{"messages":[{"role":"user","content":"{\"model\":\"no\"}"}],"stream":true,"model":"m2"}`, "m2", nil},
		{`{"nested":{"model":"inner"},"model":"outer"}`, "outer", nil},
		{` { "model" : "spaced\u002fname" } `, "spaced/name", nil},
		{`{"a":"}{\"","model":"m","b":[1,{"c":"]"}],"d":null,"e":-1.5e3}`, "m", nil},
		{`{"messages":[]}`, "", errNoModel},
		{`{"model":7}`, "", errNoModel},
		{`{"model":""}`, "", errNoModel},
		{`{}`, "", errNoModel},
		{`{"model":"A","model":"B"}`, "", errAmbiguousModel},
		{`{"model":"A","mod\u0065l":"B"}`, "", errAmbiguousModel},
		{`{"model":"A","messages":[],"model":7}`, "", errAmbiguousModel},
		{`[{"model":"m"}]`, "", errInvalidJSON},
		{`{"model":`, "", errInvalidJSON},
		{`{"model":"m"} trailing`, "", errInvalidJSON},
		{`model=m`, "", errInvalidJSON},
		{``, "", errInvalidJSON},
	} {
		got, err := ModelOf([]byte(tc.body))
		if err != tc.err || got != tc.want {
			t.Errorf("ModelOf(%s) = %q, %v; want %q, %v", tc.body, got, err, tc.want, tc.err)
		}
	}
}

// FuzzModelOf holds ModelOf to encoding/json: a body it accepts is a JSON
// object whose decoded top level has that "model" (and only one such key,
// escapes read); a body json.Valid accepts as an object is never called
// invalid.
func FuzzModelOf(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"content":"x"}]}`))
	f.Add([]byte(`{"a":[[[[{}]]]],"model":"m"}`))
	f.Add([]byte(`{"model":"A","model":"B"}`))
	f.Add([]byte(`{"mod\u0065l":"A","x":"\"model\""}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := ModelOf(body)
		var top map[string]json.RawMessage
		objectErr := json.Unmarshal(body, &top)
		switch {
		case err == nil:
			if m == "" {
				t.Fatal("empty model without an error")
			}
			var want string
			if objectErr != nil || json.Unmarshal(top["model"], &want) != nil || want != m {
				t.Fatalf("ModelOf says %q; encoding/json reads %q (%v)", m, want, objectErr)
			}
			if n := countModelKeys(body); n != 1 {
				t.Fatalf("accepted a body with %d top-level model keys", n)
			}
		case err == errInvalidJSON:
			if objectErr == nil {
				t.Fatalf("a JSON object called invalid: %q", body)
			}
		case err == errAmbiguousModel:
			if n := countModelKeys(body); n < 2 {
				t.Fatalf("called ambiguous with %d model keys: %q", n, body)
			}
		}
	})
}

// countModelKeys counts the top-level "model" keys of a JSON object with
// encoding/json's tokenizer.
func countModelKeys(body []byte) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return -1
	}
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return -1
		}
		if tok == "model" {
			n++
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return -1
		}
	}
	return n
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

// TestRequestAsksForAStream: only a top-level "stream": true asks for a
// stream, the one kind of answer the gateway may detach (detach.go); any
// other request skips building what a detached answer needs.
func TestRequestAsksForAStream(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","stream":true}`:                  true,
		`{"stream" : true ,"model":"m"}`:               true,
		`{"model":"m","stream":false}`:                 false,
		`{"model":"m","stream":"true"}`:                false,
		`{"model":"m","options":{"stream":true}}`:      false,
		`{"model":"m","messages":[{"stream":true}]}`:   false,
		`{"model":"m"}`:                                false,
		`{"stream":true,"messages":[{"role":"user"}]}`: true, // the model from X-Model
	} {
		h, err := parseRequest([]byte(body))
		if err != nil && err != errNoModel {
			t.Fatalf("%s: %v", body, err)
		}
		if h.stream != want {
			t.Errorf("%s: stream %v, want %v", body, h.stream, want)
		}
	}
}

// TestPromptHeadStaysOverTurns: the part prefix affinity hashes is the same
// on every turn of a conversation (the system prompt and the first user
// message), and differs between conversations.
func TestPromptHeadStaysOverTurns(t *testing.T) {
	turn1 := `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Plan a trip"}]}`
	turn2 := `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Plan a trip"},{"role":"assistant","content":"Where?"},{"content":"Rome","role":"user"}],"stream":true}`
	other := `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Fix my code"}]}`
	head := func(body string) string {
		t.Helper()
		h, err := parseRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return string(h.prompt)
	}
	want := `[{"role":"system","content":"You are terse."},{"role":"user","content":"Plan a trip"}`
	if h1, h2 := head(turn1), head(turn2); h1 != want || h2 != want {
		t.Errorf("heads:\n%s\n%s\nwant both\n%s", h1, h2, want)
	}
	if head(other) == want {
		t.Error("another conversation has the same head")
	}
	for body, want := range map[string]string{
		`{"model":"m","prompt":"Once upon a time"}`:    `"Once upon a time"`,
		`{"input":["a","b"],"model":"m"}`:              `["a","b"]`,
		`{"model":"m","messages":[{"role":"system"}]}`: `[{"role":"system"}]`,
		`{"model":"m"}`: ``,
	} {
		if got := head(body); got != want {
			t.Errorf("%s: head %q, want %q", body, got, want)
		}
	}
}

// FuzzPromptHead: whatever the body, the head is a prefix of the prompt's
// value and parsing agrees with ModelOf.
func FuzzPromptHead(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"\u0075ser"},{"role":["user"]},1,"x"]}`))
	f.Add([]byte(`{"model":"m","prompt":[1,2,3]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m1, err1 := ModelOf(body)
		h, err2 := parseRequest(body)
		if m1 != h.model || err1 != err2 {
			t.Fatalf("parseRequest (%q, %v) disagrees with ModelOf (%q, %v)", h.model, err2, m1, err1)
		}
		if h.prompt != nil && !bytes.Contains(body, h.prompt) {
			t.Fatalf("head %q is not part of the body", h.prompt)
		}
	})
}

// TestModelsAnswerWhenFirstSeen: /v1/models and /v1/models/{id} answer a
// model's created as when this gateway first saw a site serve it, which a
// later rebuild keeps.
func TestModelsAnswerWhenFirstSeen(t *testing.T) {
	before := time.Now().Unix()
	g := benchGateway(t, "http://127.0.0.1:9")
	defer g.Close()
	after := time.Now().Unix()
	g.refresh()
	created := func(path string) int64 {
		rec := httptest.NewRecorder()
		g.ClientHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var one struct {
			Created int64 `json:"created"`
			Data    []struct {
				Created int64 `json:"created"`
			} `json:"data"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &one); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body.String())
		}
		if len(one.Data) == 1 {
			return one.Data[0].Created
		}
		return one.Created
	}
	list, single := created("/v1/models"), created("/v1/models/"+sim.DefaultModel)
	if list < before || list > after || single != list {
		t.Errorf("created %d (list) and %d (one), want the first sighting, between %d and %d", list, single, before, after)
	}
}

// TestRequestCost: the estimated size of a request of each API shape. A
// prompt of text weighs its JSON's bytes over four, rounded up; token IDs
// count one each; the output limit is max_completion_tokens, else
// max_tokens, else max_output_tokens, and only a non-negative integer.
func TestRequestCost(t *testing.T) {
	chat := `[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in French."}]` // 95 bytes
	for _, tc := range []struct {
		name, body        string
		prompt, maxOutput int
	}{
		{"chat", `{"model":"m","messages":` + chat + `,"max_tokens":64}`, 24, 64},
		{"chat, max_completion_tokens wins", `{"model":"m","max_tokens":64,"messages":` + chat + `,"max_completion_tokens":32}`, 24, 32},
		{"completion, text", `{"model":"m","prompt":"Once upon a time","max_tokens":16}`, 5, 16},
		{"completion, token IDs", `{"model":"m","prompt":[101, 2023, 2003, 1037, 3231, 102]}`, 6, 0},
		{"completion, a batch of token IDs", `{"model":"m","prompt":[[1,2,3],[4,5]],"max_tokens":8}`, 5, 8},
		{"completion, a batch of texts", `{"model":"m","prompt":["ab","cd"]}`, 3, 0},
		{"embedding", `{"model":"m","input":"The food was delicious."}`, 7, 0},
		{"responses", `{"model":"m","input":[{"role":"user","content":"hi"}],"max_output_tokens":100}`, 8, 100},
		{"numbers that are not IDs are text", `{"model":"m","prompt":[1.5,2]}`, 2, 0},
		{"a limit that is not a count", `{"model":"m","prompt":"x","max_tokens":-5,"max_output_tokens":"9"}`, 1, 0},
		{"a limit of zero gives way", `{"model":"m","prompt":"x","max_completion_tokens":0,"max_tokens":7}`, 1, 7},
		{"no prompt", `{"model":"m"}`, 0, 0},
		{"IDs nested deeper than a batch are text", `{"model":"m","prompt":[[[1]]]}`, 2, 0},
	} {
		head, err := parseRequest([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if head.cost != (route.Cost{Prompt: tc.prompt, MaxOutput: tc.maxOutput}) {
			t.Errorf("%s: cost %+v, want prompt %d, max output %d", tc.name, head.cost, tc.prompt, tc.maxOutput)
		}
	}
}

// TestJSONStringDecodesAsEncodingJSON: the plain path and the decoder
// agree on every kind of string token a model name may come as.
func TestJSONStringDecodesAsEncodingJSON(t *testing.T) {
	for _, tok := range []string{
		`"llama-3.1-8b"`, `""`, `"Qwen/Qwen2.5-7B"`, `"mod\u0065l"`, `"a\"b"`, `"a\\b"`,
		`"caf` + "\xc3\xa9" + `"`, // UTF-8: plain
		`"bad` + "\xff" + `"`,     // not UTF-8: encoding/json reads U+FFFD
	} {
		got, err := jsonString([]byte(tok))
		var want string
		wantErr := json.Unmarshal([]byte(tok), &want)
		if got != want || (err == nil) != (wantErr == nil) {
			t.Errorf("jsonString(%s) = %q, %v; encoding/json: %q, %v", tok, got, err, want, wantErr)
		}
	}
	name := []byte(`"llama-3.1-8b"`)
	if n := testing.AllocsPerRun(100, func() { jsonString(name) }); n > 1 {
		t.Errorf("a plain model name costs %v allocations, want at most its string's", n)
	}
}
