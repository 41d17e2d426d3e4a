package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/signals"
)

const validOperator = `
site: east
tls: {ca: certs/ca.crt, cert: certs/east.crt, key: certs/east.key}
signals: {listen: "127.0.0.1:9091"}
metrics: {listen: "127.0.0.1:9090"}
scrapeInterval: 1s
peerPollInterval: 5s
stateDir: state/east
peers:
  - {site: west, signals: "https://127.0.0.1:9191", gateway: "https://127.0.0.1:8181"}
providers:
  - name: qwen-pool
    model: Qwen/Qwen3-8B
    kind: epp
    metrics: {endpoint: "http://127.0.0.1:9000", path: /metrics, poolName: qwen-pool, timeout: 2s}
    upstream: "http://127.0.0.1:8000"
`

func TestOperatorValidAndDefaults(t *testing.T) {
	c, err := ParseOperator("site.yaml", []byte(validOperator))
	if err != nil {
		t.Fatal(err)
	}
	if c.TrustDomain != "grid.internal" || c.SignalsTTL.D() != 30*time.Second || c.ScrapeConcurrency != 16 {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.PeerPoll.Attempts != 3 || c.PeerPoll.Budget.D() != 10*time.Second {
		t.Errorf("peer poll defaults not applied: %+v", c.PeerPoll)
	}
	if got := c.StaleAfter(&c.Providers[0]); got != 15*time.Second {
		t.Errorf("stale window = %v, want half the TTL", got)
	}
}

func TestOperatorMinimalGetsEveryDefault(t *testing.T) {
	c, err := ParseOperator("min.yaml", []byte("site: east\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != "state/east" || c.ScrapeInterval.D() != time.Second || c.Metrics.Listen != DefaultOperatorMetrics {
		t.Errorf("defaults: %+v", c)
	}
}

func TestOperatorRejections(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // every fragment must appear in the error
	}{
		{"unknown top-level key", "site: east\nscrapeIntervall: 1s\n",
			[]string{`op.yaml:2: unknown key "scrapeIntervall"`, `did you mean "scrapeInterval"`}},
		{"unknown nested key", "site: east\nproviders:\n  - name: a\n    model: m\n    upstream: http://x\n    metrics: {endpoint: 'http://x', timout: 2s}\n",
			[]string{`op.yaml:6: unknown key "providers[0].metrics.timout"`}},
		{"duplicate key", "site: east\nsite: west\n", []string{`op.yaml:2: duplicate key "site"`}},
		{"missing site", "scrapeInterval: 1s\n", []string{"site: required"}},
		{"site not a label", "site: East_1\n", []string{`op.yaml:1: site: "East_1" is not a DNS-1123 label`}},
		{"site too long", "site: " + strings.Repeat("a", 64) + "\n", []string{"is not a DNS-1123 label"}},
		{"bare number duration", "site: east\nscrapeInterval: 5\n", []string{"op.yaml:2", "duration must be a string with a unit"}},
		{"bad duration", "site: east\nscrapeInterval: fast\n", []string{`invalid duration "fast"`}},
		{"negative duration", "site: east\nsignalsTTL: -1s\n", []string{"op.yaml:2: signalsTTL: must be a positive duration"}},
		{"bad listen", "site: east\nmetrics: {listen: nowhere}\n", []string{`metrics.listen: "nowhere" is not a host:port`}},
		{"type mismatch", "site: east\nscrapeConcurrency: many\n", []string{"op.yaml:2", "cannot unmarshal"}},
		{"peer without tls", "site: east\npeers:\n  - {site: west, signals: 'https://w:1'}\n", []string{"peers are polled over mutual TLS only"}},
		{"peer is self", "site: east\ntls: {ca: a, cert: b, key: c}\npeers:\n  - {site: east, signals: 'https://w:1'}\n", []string{"is this site"}},
		{"peer plaintext", "site: east\ntls: {ca: a, cert: b, key: c}\npeers:\n  - {site: west, signals: 'http://w:1'}\n", []string{`peers[0].signals: URL "http://w:1" must use https`}},
		{"peer twice", "site: east\ntls: {ca: a, cert: b, key: c}\npeers:\n  - {site: west, signals: 'https://w:1'}\n  - {site: west, signals: 'https://w:2'}\n", []string{`"west" is listed twice`}},
		{"tls incomplete", "site: east\ntls: {ca: a}\n", []string{"tls.cert: required", "tls.key: required"}},
		{"membership without tls", "site: east\nmembership: {keyFile: k, signals: 'https://east.example:9091'}\n", []string{"members are polled over mutual TLS only"}},
		{"membership without key", "site: east\ntls: {ca: a, cert: b, key: c}\nmembership: {signals: 'https://east.example:9091'}\n",
			[]string{"membership.keyFile: required: gossip is encrypted or not used"}},
		{"membership advertises loopback", "site: east\ntls: {ca: a, cert: b, key: c}\nmembership: {keyFile: k, signals: 'https://127.0.0.1:9091'}\n",
			[]string{"membership.signals: other members would refuse it", "loopback"}},
		{"membership without signals", "site: east\ntls: {ca: a, cert: b, key: c}\nmembership: {keyFile: k}\n", []string{"membership.signals: required"}},
		{"membership bad seed and profile", "site: east\ntls: {ca: a, cert: b, key: c}\nmembership: {keyFile: k, signals: 'https://e.example:1', seeds: [nohost], profile: moon}\n",
			[]string{`membership.seeds[0]: "nohost" is not host:port`, `membership.profile: "moon" is not one of`}},
		{"provider name", "site: east\nproviders:\n  - {name: Pool_A, model: m, upstream: 'http://u', metrics: {endpoint: 'http://x'}}\n",
			[]string{`op.yaml:3: providers[0].name: "Pool_A" is not a DNS-1123 label`}},
		{"provider kind", "site: east\nproviders:\n  - {name: a, model: m, kind: triton, upstream: 'http://u', metrics: {endpoint: 'http://x'}}\n",
			[]string{`"triton" is not one of epp, vllm, sglang, auto, generic`}},
		{"provider endpoint missing", "site: east\nproviders:\n  - {name: a, model: m, upstream: 'http://u'}\n", []string{"providers[0].metrics.endpoint: required"}},
		{"provider endpoint not a URL", "site: east\nproviders:\n  - {name: a, model: m, upstream: 'http://u', metrics: {endpoint: '127.0.0.1:9000'}}\n",
			[]string{"providers[0].metrics.endpoint"}},
		{"provider model missing", "site: east\nproviders:\n  - {name: a, upstream: 'http://u', metrics: {endpoint: 'http://x'}}\n", []string{"providers[0].model: required"}},
		{"provider twice", "site: east\nproviders:\n  - {name: a, model: m, upstream: 'http://u', metrics: {endpoint: 'http://x'}}\n  - {name: a, model: m, upstream: 'http://u', metrics: {endpoint: 'http://x'}}\n",
			[]string{`providers[1].name: "a" is listed twice`}},
		{"provider credentials in URL", "site: east\nproviders:\n  - {name: a, model: m, upstream: 'http://u:p@u', metrics: {endpoint: 'http://x'}}\n", []string{"must not carry credentials"}},
		{"client cert without key", "site: east\nproviders:\n  - {name: a, model: m, upstream: 'http://u', metrics: {endpoint: 'https://x', tls: {cert: c}}}\n", []string{"cert and key go together"}},
		{"two documents", "site: east\n---\nsite: west\n", []string{"one YAML document"}},
		{"negative maxRunning", "site: east\nproviders:\n  - {name: a, model: m, upstream: 'http://u', metrics: {endpoint: 'http://x'}, maxRunning: -4}\n", []string{`providers[0].maxRunning: must not be negative`}},
		{"unknown admission", "site: east\nproviders:\n  - {name: a, model: m, upstream: 'http://u', metrics: {endpoint: 'http://x'}, admission: drain}\n", []string{`providers[0].admission: "drain" is not one of new_and_existing, existing_only, none`}},
		{"reports every problem", "site: East\nscrapeInterval: -1s\n", []string{"site:", "scrapeInterval:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseOperator("op.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestGatewayRejections(t *testing.T) {
	base := "site: east\ntls: {ca: a, cert: b, key: c}\noperator: {signals: 'https://127.0.0.1:9091'}\n"
	if _, err := ParseGateway("gw.yaml", []byte(base)); err != nil {
		t.Fatalf("base config rejected: %v", err)
	}
	tests := []struct{ name, yaml, want string }{
		{"no tls", "site: east\noperator: {signals: 'https://o:1'}\n", "tls: required"},
		{"no operator", "site: east\ntls: {ca: a, cert: b, key: c}\n", "operator.signals: required"},
		{"unknown availability key", base + "availability: {shedding: true, smooth: 0.2}\n", `gw.yaml:4: unknown key "availability.smooth"`},
		{"smoothing zero", base + "availability: {smoothing: 0}\n", "availability.smoothing: must be in"},
		{"explore floor above one", base + "availability: {explore_floor: 1.5}\n", "availability.explore_floor"},
		{"ceiling floor below one", base + "availability: {ceiling_floor: 0.5}\n", "availability.ceiling_floor"},
		{"negative full after", base + "availability: {full_after_ms: -1}\n", "availability.full_after_ms"},
		{"negative hold", base + "availability: {holdWhenFull: -1s}\n", "availability.holdWhenFull"},
		{"negative detach delay", base + "limits: {detachAfter: -1s}\n", "limits.detachAfter"},
		{"zero half life", base + "availability: {ceiling_half_life_ms: 0}\n", "availability.ceiling_half_life_ms"},
		{"bad hop listen", base + "hop: {listen: ':'}\n", "hop.listen"},
		{"affinity ttl over a day", base + "affinity: {header: X-Session-Id, ttl: 25h}\n", "affinity.ttl: must be positive and at most 24h"},
		{"affinity header not a token", base + "affinity: {header: 'X Session'}\n", `affinity.header: "X Session" is not a header name`},
		{"affinity threshold zero", base + "affinity: {header: X-Session-Id, threshold: 0}\n", "affinity.threshold: must be in"},
		{"affinity table too small", base + "affinity: {header: X-Session-Id, maxBytes: 100}\n", "affinity.maxBytes: must be at least 4096"},
		{"prefix exploration above one", base + "affinity: {prefix: {enabled: true, exploration: 2}}\n", "affinity.prefix.exploration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseGateway("gw.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestGatewayZeroKnobIsKept(t *testing.T) {
	c, err := ParseGateway("gw.yaml", []byte("site: east\ntls: {ca: a, cert: b, key: c}\noperator: {signals: 'https://o:1'}\navailability: {explore_floor: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if *c.Availability.ExploreFloor != 0 || *c.Availability.Smoothing != DefaultSmoothing {
		t.Errorf("availability = %+v", c.Availability)
	}
}

func TestLoadFileNamesFile(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "site.yaml")
	if err := os.WriteFile(f, []byte("site: east\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadOperator(f)
	if err == nil || !strings.Contains(err.Error(), f+":2") {
		t.Fatalf("error %v does not name %s:2", err, f)
	}
	if _, err := LoadOperator(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
}

// TestExamplesLoad keeps examples/ working: every example config must pass.
func TestExamplesLoad(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*/*.yaml")
	for _, f := range files {
		var err error
		if strings.Contains(filepath.Base(f), "gateway") {
			_, err = LoadGateway(f)
		} else {
			_, err = LoadOperator(f)
		}
		if err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestConfigurationDocumented fails when a configuration key is missing from
// docs/configuration.md, so the reference never falls behind the code.
func TestConfigurationDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []struct {
		name string
		v    any
	}{{"operator", Operator{}}, {"gateway", Gateway{}}} {
		for _, key := range KeyPaths(kind.v) {
			if !strings.Contains(string(doc), "`"+key+"`") {
				t.Errorf("docs/configuration.md does not document the %s key `%s`", kind.name, key)
			}
		}
	}
}

func FuzzParseOperator(f *testing.F) {
	f.Add([]byte(validOperator))
	f.Add([]byte("site: east\nproviders: [{name: a}]\n"))
	f.Add([]byte("{{{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseOperator("fuzz.yaml", data)
		if err == nil && !signals.IsDNS1123Label(c.Site) {
			t.Fatalf("accepted invalid site %q", c.Site)
		}
	})
}

func FuzzParseGateway(f *testing.F) {
	f.Add([]byte("site: east\noperator: {signals: 'https://127.0.0.1:9091'}\ntls: {ca: a, cert: b, key: c}\n"))
	f.Add([]byte("site: east\navailability: {smoothing: 2, policy: fast}\nlimits: {clientConns: -1}\n"))
	f.Add([]byte("[[["))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseGateway("fuzz.yaml", data)
		if err != nil {
			return
		}
		if !signals.IsDNS1123Label(c.Site) || c.TLS == nil || c.PollInterval <= 0 || *c.Availability.Smoothing <= 0 || *c.Availability.Smoothing > 1 {
			t.Fatalf("accepted an invalid configuration: %+v", c)
		}
	})
}

// TestRelativePathsFollowTheFile: paths in a configuration file are read
// against the file's directory, wherever the daemon was started from;
// absolute paths stay as written.
func TestRelativePathsFollowTheFile(t *testing.T) {
	dir := t.TempDir()
	op := filepath.Join(dir, "east.yaml")
	os.WriteFile(op, []byte("site: east\ntls: {ca: certs/ca.crt, cert: /abs/east.crt, key: certs/east.key}\n"+
		"providers:\n  - {name: p, model: m, kind: epp, upstream: \"http://127.0.0.1:9000\", metrics: {endpoint: \"http://127.0.0.1:9000\", bearerTokenFile: token}}\n"), 0o600)
	c, err := LoadOperator(op)
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS.CA != filepath.Join(dir, "certs/ca.crt") || c.TLS.Cert != "/abs/east.crt" || c.StateDir != filepath.Join(dir, "state/east") ||
		c.Providers[0].Metrics.BearerTokenFile != filepath.Join(dir, "token") {
		t.Errorf("operator paths: tls %+v, stateDir %s, token %s", c.TLS, c.StateDir, c.Providers[0].Metrics.BearerTokenFile)
	}
	gw := filepath.Join(dir, "east-gateway.yaml")
	os.WriteFile(gw, []byte("site: east\ntls: {ca: certs/ca.crt, cert: certs/east.crt, key: certs/east.key}\noperator: {signals: \"https://127.0.0.1:9091\"}\n"), 0o600)
	g, err := LoadGateway(gw)
	if err != nil {
		t.Fatal(err)
	}
	if g.TLS.Key != filepath.Join(dir, "certs/east.key") {
		t.Errorf("gateway key %s", g.TLS.Key)
	}
}

// referenceKnobs are the availability knobs the product description and the
// reference name in snake_case: kept as written (docs/configuration.md).
var referenceKnobs = map[string]bool{
	"availability.ceiling_half_life_ms": true, "availability.ceiling_floor": true, "availability.explore_floor": true,
	"availability.full_after_ms": true, "availability.room_after_ms": true, "availability.queue_full": true,
}

// TestKeyNamesFollowTheRule: every key of both schemas is lowerCamelCase but
// the reference's availability knobs.
func TestKeyNamesFollowTheRule(t *testing.T) {
	camel := regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)
	for _, v := range []any{Operator{}, Gateway{}} {
		for _, path := range KeyPaths(v) {
			key := path[strings.LastIndexByte(path, '.')+1:]
			key = strings.TrimSuffix(key, "[]")
			if !camel.MatchString(key) && !referenceKnobs[path] {
				t.Errorf("key %s is not lowerCamelCase (docs/configuration.md, key names)", path)
			}
		}
	}
}

// TestRenamedKeyIsReadWithAWarning: a key in its old spelling is read as the
// new one, and the configuration says where and what it is called now; the
// two spellings together are a duplicate.
func TestRenamedKeyIsReadWithAWarning(t *testing.T) {
	base := "site: east\ntls: {ca: a, cert: b, key: c}\noperator: {signals: 'https://o:1'}\n"
	c, err := ParseGateway("gw.yaml", []byte(base+"availability:\n  ceiling_model: single\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Availability.CeilingModel != CeilingSingle {
		t.Errorf("ceiling_model: single read as %q", c.Availability.CeilingModel)
	}
	want := `gw.yaml:5: "availability.ceiling_model" is deprecated; it is now "availability.ceilingModel"`
	if len(c.Deprecated) != 1 || c.Deprecated[0] != want {
		t.Errorf("deprecations %q, want [%s]", c.Deprecated, want)
	}
	if c, err := ParseGateway("gw.yaml", []byte(base+"availability: {ceilingModel: single}\n")); err != nil || len(c.Deprecated) != 0 || c.Availability.CeilingModel != CeilingSingle {
		t.Errorf("the new spelling: %v, deprecations %q", err, c.Deprecated)
	}
	if _, err := ParseGateway("gw.yaml", []byte(base+"availability: {ceilingModel: single, ceiling_model: bounds}\n")); err == nil || !strings.Contains(err.Error(), "duplicate key") {
		t.Errorf("both spellings: %v, want a duplicate key", err)
	}
}
