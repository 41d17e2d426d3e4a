package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestBenchSitesSmoke runs grid bench sites for a few seconds of one
// scenario with every router, on real processes (grid sim, operators,
// gateways, nginx), and checks that its TSV has every column for every
// router, with requests measured and none failed. It skips where nginx is
// not installed, except where GRID_REQUIRE_NGINX=1 (CI sets it after
// installing nginx): there a missing nginx fails the test.
func TestBenchSitesSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a grid of processes per router")
	}
	if _, err := exec.LookPath("/usr/sbin/nginx"); err != nil {
		if os.Getenv("GRID_REQUIRE_NGINX") == "1" {
			t.Fatal("nginx is not installed, and GRID_REQUIRE_NGINX=1: the sites benchmark's smoke test must run")
		}
		t.Skip("nginx is not installed (apt-get install nginx-light)")
	}
	routers := []string{"grid", "grid:reference", "grid:latency", "nginx-wrr", "nginx-least-conn"}
	cmd := exec.Command(gridBinary, "bench", "sites", "--slots", "8,16", "--load", "0.5", "--warmup", "3s", "--duration", "4s",
		"--routers", strings.Join(routers, ","), "--scenarios", "steady", "--format", "tsv")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("grid bench sites: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	header := "scenario\trouter\trun\trequests\terrors\tttft_p50_ms\tttft_p99_ms\te2e_mean_ms\te2e_p99_ms"
	if len(lines) != 1+len(routers) || lines[0] != header {
		t.Fatalf("want the header and a line per router, got:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
	for i, line := range lines[1:] {
		cols := strings.Split(line, "\t")
		if len(cols) != 9 || cols[0] != "steady" || cols[1] != routers[i] || cols[2] != "1" {
			t.Errorf("line %q: want steady, %s, run 1 and nine columns", line, routers[i])
			continue
		}
		for k, c := range cols[3:] {
			v, err := strconv.ParseFloat(c, 64)
			if err != nil || v < 0 {
				t.Errorf("%s: column %d is %q", routers[i], k+4, c)
			}
		}
		if cols[3] == "0" || cols[4] != "0" {
			t.Errorf("%s: %s requests, %s errors; want some, none failed\n%s", routers[i], cols[3], cols[4], errOut.String())
		}
		if cols[5] == "0.0" || cols[8] == "0.0" {
			t.Errorf("%s: no latency measured: %q", routers[i], line)
		}
	}
}
