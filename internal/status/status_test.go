package status

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// golden compares out with testdata/name, which -update rewrites.
func golden(t *testing.T, name, out string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("output differs from %s:\n--- got\n%s--- want\n%s", path, out, want)
	}
}

func TestReport(t *testing.T) {
	page := `# HELP grid_provider_ready x
grid_provider_ready{grid_provider="east-pool",grid_site="east"} 1
grid_provider_ready_endpoints{grid_provider="east-pool",grid_site="east"} 2
grid_provider_in_flight_requests{grid_provider="east-pool",grid_site="east"} 7
grid_provider_ready{grid_provider="west-pool",grid_site="west"} 0
grid_provider_readiness{grid_provider="east-pool",grid_site="east",reason="Ready",status="True"} 1
grid_provider_admission{admission="new_and_existing",grid_provider="east-pool",grid_site="east"} 1
grid_provider_admission{admission="existing_only",grid_provider="west-pool",grid_site="west"} 1
grid_collection_up{peer="west"} 1
grid_peer_last_success_timestamp_seconds{peer="west"} 1000
grid_peer_ages_rejected{peer="west"} 1
grid_gateway_ages_rejected 1
`
	r, err := Parse([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r.Write(&out, time.Unix(1003, 0))
	s := out.String()
	golden(t, "operator.txt", s)
	for _, line := range strings.Split(s, "\n") {
		if len(line) > 80 {
			t.Errorf("line wider than 80 columns: %q", line)
		}
	}
}

func TestGatewayReport(t *testing.T) {
	page := `grid_route_site_rho{cluster="east-pool",site="east"} 0.5
grid_route_site_ceiling{cluster="east-pool",site="east"} 16
grid_route_site_weight{cluster="east-pool",site="east"} 16
grid_route_site_score{cluster="east-pool",site="east"} 0
grid_route_site_score{cluster="west-pool",site="west"} NaN
grid_route_site_rho{cluster="west-pool",site="west"} NaN
grid_route_decisions_total{cluster="east-pool",reason="routed",site="east"} 12
grid_route_decisions_total{cluster="",reason="shed",site=""} 3
grid_route_shedding{model="m"} 1
`
	r, err := Parse([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r.Write(&out, time.Now())
	golden(t, "gateway.txt", out.String())
}
