package membership

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseMetaChecksTheClaim(t *testing.T) {
	for _, tc := range []struct {
		node, meta string
		want       string // "" accepts
	}{
		{"east", `{"v":1,"site":"east","signals":"https://east.example:9091","gateway":"https://east.example:8081"}`, ""},
		{"east", `{"v":1,"site":"east","signals":"https://10.1.2.3:9091"}`, ""},
		{"east", `{"v":1,"site":"west","signals":"https://east.example:9091"}`, "names site"},
		{"east", `{"v":2,"site":"east","signals":"https://east.example:9091"}`, "version"},
		{"east", `{"v":1,"site":"east","signals":"https://127.0.0.1:9091"}`, "loopback"},
		{"east", `{"v":1,"site":"east","signals":"https://east.example:9091","gateway":"https://169.254.169.254:80"}`, "gateway address"},
		{"east", `{"v":1,"site":"east","signals":"http://east.example:9091"}`, "https"},
		{"east", `{"v":1,"site":"east","signals":"https://east.example:9091","extra":1}`, "unknown field"},
		{"east", `not json`, "metadata"},
		{"east", ``, "metadata"},
	} {
		_, err := parseMeta(tc.node, []byte(tc.meta))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.meta, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.meta, err, tc.want)
		}
	}
}

func TestStartRefuses(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no key":        {Site: "east", Bind: "127.0.0.1:0", Signals: "https://east.example:9091"},
		"bad profile":   {Site: "east", Bind: "127.0.0.1:0", Key: make([]byte, 16), Profile: "moon"},
		"bad bind":      {Site: "east", Bind: "127.0.0.1", Key: make([]byte, 16)},
		"huge metadata": {Site: "east", Bind: "127.0.0.1:0", Key: make([]byte, 16), Signals: "https://" + strings.Repeat("a", 600) + ":1"},
	} {
		if c, err := Start(cfg); err == nil {
			c.ml.Shutdown()
			t.Errorf("%s: started", name)
		}
	}
}
