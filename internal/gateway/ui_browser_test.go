package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	// History the gateway kept before the page was opened: points, a time
	// to first token, refusals and a note.
	g.hist.firstByte("east", 50*time.Millisecond)
	for range 3 {
		g.hist.refused(http.StatusTooManyRequests)
	}
	g.hist.refused(http.StatusServiceUnavailable)
	g.refresh()
	g.Note("a burst fills west")
	g.refresh()
	g.refresh()
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
	eastColor := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"}[fnv1a("east")%8]
	for _, want := range []string{"Grid gateway", "— site east", `<td>pool</td>`, "ready",
		"3 shed (429), 1 unavailable (503)", // refusals kept by the server
		"a burst fills west",                // the story's notes
		`<td class="ttft">0.050</td>`,       // time to first token
		`color:` + eastColor,                // a site's colour comes from its name
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	// The history predates the page: every point the gateway kept shows.
	if m := regexp.MustCompile(`(\d+) points`).FindStringSubmatch(dom); m == nil || m[1] != strconv.Itoa(len(g.hist.view("east").Points)) {
		t.Errorf("the page shows %v of the %d points kept", m, len(g.hist.view("east").Points))
	}
	shot := filepath.Join(t.TempDir(), "ui.png")
	run("--screenshot="+shot, srv.URL+"/ui")
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot: %v, %d bytes", err, st.Size())
	}
}

// fnv1a is the page's colour hash (FNV-1a, 32 bits).
func fnv1a(s string) uint32 {
	h := uint32(0x811c9dc5)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 0x01000193
	}
	return h
}
