package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gridCerts issues a grid CA and one certificate per site with `grid
// certs`, into dir.
func gridCerts(t *testing.T, dir string, sites ...string) {
	t.Helper()
	grid := binary(t, gridPart)
	runs := [][]string{{"certs", "init", "--dir", dir}}
	for _, s := range sites {
		runs = append(runs, []string{"certs", "issue", "--dir", dir, "--site", s})
	}
	for _, args := range runs {
		if out, err := exec.Command(grid, args...).CombinedOutput(); err != nil {
			t.Fatalf("grid %v: %v\n%s", args, err, out)
		}
	}
}

// provider is one InferenceProvider block of a file-mode operator.
type provider struct {
	name, model, kind string
	upstream, metrics string // base URLs
	pool, tokenFile   string // EPP: metrics.poolName, metrics.bearerTokenFile
	refresh           string // EPP: metrics.refreshInterval
}

// site is one site of file-mode Grid processes: an operator and a
// gateway, with the addresses the test reaches them on.
type site struct {
	name                            string
	signals, opMetrics, client, hop int
	gwMetrics                       int
	operator, gateway               *process
	operatorConfig, gatewayConfig   string
	providers                       []provider
	peers                           []*site
	shedding                        bool
	// gatewayOnly starts the gateway alone: the site's operator is one
	// the test runs itself (in Kubernetes mode), listening on signals.
	gatewayOnly bool
}

func newSite(t *testing.T, name string, providers ...provider) *site {
	return &site{name: name, providers: providers,
		signals: freePort(t), opMetrics: freePort(t), client: freePort(t), hop: freePort(t), gwMetrics: freePort(t)}
}

// start writes the site's two configurations under dir (certs from
// gridCerts in dir/certs) and starts its operator and gateway.
func (s *site) start(t *testing.T, dir string) {
	t.Helper()
	certs := filepath.Join(dir, "certs")
	tls := fmt.Sprintf("tls: {ca: %[1]s/ca.crt, cert: %[1]s/%[2]s.crt, key: %[1]s/%[2]s.key}", certs, s.name)
	var peers, providers strings.Builder
	for _, p := range s.peers {
		fmt.Fprintf(&peers, "  - {site: %s, signals: \"https://%s\", gateway: \"https://%s\"}\n", p.name, addr(p.signals), addr(p.hop))
	}
	for _, p := range s.providers {
		metrics := fmt.Sprintf("endpoint: %q", p.metrics)
		if p.pool != "" {
			metrics += fmt.Sprintf(", poolName: %q", p.pool)
		}
		if p.tokenFile != "" {
			metrics += fmt.Sprintf(", bearerTokenFile: %q", p.tokenFile)
		}
		if p.refresh != "" {
			metrics += fmt.Sprintf(", refreshInterval: %s", p.refresh)
		}
		fmt.Fprintf(&providers, "  - {name: %s, model: %s, kind: %s, upstream: %q, metrics: {%s}}\n", p.name, p.model, p.kind, p.upstream, metrics)
	}
	op := fmt.Sprintf("site: %s\n%s\nsignals: {listen: %q}\nmetrics: {listen: %q}\nstateDir: %s\nscrapeInterval: 200ms\npeerPollInterval: 500ms\npeers:\n%sproviders:\n%s",
		s.name, tls, addr(s.signals), addr(s.opMetrics), filepath.Join(dir, "state-"+s.name), peers.String(), providers.String())
	gw := fmt.Sprintf("site: %s\n%s\nlisten: %q\nhop: {listen: %q}\nmetrics: {listen: %q}\noperator: {signals: \"https://%s\"}\npollInterval: 250ms\n",
		s.name, tls, addr(s.client), addr(s.hop), addr(s.gwMetrics), addr(s.signals))
	if s.shedding {
		gw += "availability: {shedding: true, full_after_ms: 1000, room_after_ms: 500}\n"
	}
	s.operatorConfig, s.gatewayConfig = filepath.Join(dir, s.name+"-operator.yaml"), filepath.Join(dir, s.name+"-gateway.yaml")
	for file, body := range map[string]string{s.operatorConfig: op, s.gatewayConfig: gw} {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	grid := binary(t, gridPart)
	if !s.gatewayOnly {
		s.operator = run(t, grid, nil, "operator", "--config", s.operatorConfig)
	}
	s.gateway = run(t, grid, nil, "gateway", "--config", s.gatewayConfig)
}

func (s *site) operatorMetrics() string { return get("http://" + addr(s.opMetrics) + "/metrics") }

// candidate is one row of a gateway's routing snapshot (/api/snapshot).
type candidate struct {
	Site     string  `json:"site"`
	Provider string  `json:"provider"`
	Ready    bool    `json:"ready"`
	Queue    float64 `json:"queue"`
	InFlight float64 `json:"inFlight"`
	Ceiling  float64 `json:"ceiling"`
}

// candidate returns provider's row in the site's gateway snapshot.
func (s *site) candidate(provider string) (candidate, bool) {
	var snap struct {
		Candidates []candidate `json:"candidates"`
	}
	if json.Unmarshal([]byte(get("http://"+addr(s.gwMetrics)+"/api/snapshot")), &snap) != nil {
		return candidate{}, false
	}
	for _, c := range snap.Candidates {
		if c.Provider == provider {
			return c, true
		}
	}
	return candidate{}, false
}

// seesReady reports whether the site's gateway reads provider ready, and
// whether its snapshot holds the provider at all.
func (s *site) seesReady(provider string) (ready, found bool) {
	c, ok := s.candidate(provider)
	return c.Ready, ok
}
