package gateway

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDashboardInChromium loads /ui in headless Chromium (Debian's chromium
// package): after its script has run, the page shows the site's row from
// the snapshot JSON, and a screenshot renders. It skips where chromium is
// not installed, except where GRID_REQUIRE_CHROMIUM=1 (CI sets it, after
// installing chromium): there a missing browser fails the test.
func TestDashboardInChromium(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("GRID_REQUIRE_CHROMIUM") == "1" {
			t.Fatal("chromium is not installed, and GRID_REQUIRE_CHROMIUM=1: the dashboard's browser test must run")
		}
		t.Skip("chromium is not installed")
	}
	g := gatewayWithEastPool(t)
	defer g.Close()
	srv := httptest.NewServer(g.MetricsHandler())
	defer srv.Close()

	run := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=3000", "--window-size=1300,900"}
		out, err := exec.CommandContext(ctx, browser, append(base, args...)...).Output()
		if err != nil {
			t.Fatalf("chromium %v: %v", args, err)
		}
		return string(out)
	}
	dom := run("--dump-dom", srv.URL+"/ui")
	for _, want := range []string{"Grid gateway", "— site east", `<td>pool</td>`, "ready"} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	shot := filepath.Join(t.TempDir(), "ui.png")
	run("--screenshot="+shot, srv.URL+"/ui")
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot: %v, %d bytes", err, st.Size())
	}
}
