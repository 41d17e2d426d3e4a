package gateway

import (
	"context"
	"math"
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
// the snapshot JSON, five minutes of the history the gateway kept by time
// (not by a count of rebuilds) with the clock on the x axis, the events as
// numbered markers on the charts, a stacked share of picks, round axis
// ticks, and a screenshot renders. It skips where chromium is not
// installed, except where GRID_REQUIRE_CHROMIUM=1 (CI sets it, after
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
	// Six minutes of history the gateway kept before the page was opened,
	// four rebuilds a second: points, picks, a time to first token,
	// refusals and notes, one of them older than the five minutes shown.
	start := time.Now()
	for ms := 250; ms <= 360_000; ms += 250 {
		at := start.Add(time.Duration(ms) * time.Millisecond)
		switch ms {
		case 10_000:
			g.hist.note("an old note, out of the window", at)
		case 200_000:
			g.hist.note("a burst fills west", at)
		case 300_000:
			g.hist.note("demand rises", at)
		case 359_000:
			g.hist.firstByte("east", 50*time.Millisecond)
			for range 3 {
				g.hist.refused(http.StatusTooManyRequests)
			}
			g.hist.refused(http.StatusServiceUnavailable)
		}
		g.picks.add("east")
		g.hist.record(g.View(), at)
	}
	view, _ := g.hist.view("east")
	kept := view.Points
	if span := time.Duration(kept[len(kept)-1].AtMs-kept[0].AtMs) * time.Millisecond; len(kept) != 301 || span != historyWindow {
		t.Fatalf("the gateway kept %d points over %v, want a point a second over %v", len(kept), span, historyWindow)
	}
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
		"3 shed (429), 1 unavailable (503)",            // refusals kept by the server
		"a burst fills west",                           // the story's notes
		`<td class="ttft">50</td>`,                     // time to first token, in ms
		`color:` + eastColor,                           // a site's colour comes from its name
		`<span id="span">5 min 0 s, 301 points</span>`, // five minutes, by time, loaded
		`class="share-area" data-site="east"`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	// The x axis is the clock: a tick a minute over the five minutes, each
	// an hh:mm:ss, on each of the four charts.
	xticks := regexp.MustCompile(`<text class="xtick"[^>]*>(\d\d:\d\d:\d\d)</text>`).FindAllStringSubmatch(dom, -1)
	if len(xticks) < 4*5 || len(xticks) > 4*6 {
		t.Errorf("%d clock ticks on the x axes, want 5 or 6 a chart", len(xticks))
	}
	// The events inside the window are markers numbered as in the list.
	markers := regexp.MustCompile(`<text class="marker-label"[^>]*>(\d+)</text>`).FindAllStringSubmatch(dom, -1)
	if len(markers) != 4*2 || markers[0][1] != "2" || markers[1][1] != "3" {
		t.Errorf("markers %v, want events 2 and 3 on each of the four charts", markers)
	}
	if !strings.Contains(dom, "<b>2</b>") || !strings.Contains(dom, "— a burst fills west") {
		t.Error("the events list does not number its events as the markers do")
	}
	// Round y ticks: 1, 2 or 5 times a power of ten.
	for _, m := range regexp.MustCompile(`<text class="ytick"[^>]*>([0-9.]+)%?</text>`).FindAllStringSubmatch(dom, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		if v != 0 && !roundTick(v) {
			t.Errorf("y tick %q is not a round step", m[1])
		}
	}
	shot := filepath.Join(t.TempDir(), "ui.png")
	run("--screenshot="+shot, srv.URL+"/ui")
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot: %v, %d bytes", err, st.Size())
	}
}

// roundTick reports whether v is a multiple of a step of 1, 2, 2.5 or 5
// times a power of ten (a multiple of such a step is what the page's ticks
// are: 0, 0.25, 0.5, ... or 0, 2, 4, 6 ...).
func roundTick(v float64) bool {
	for _, step := range []float64{1, 2, 5} {
		for p := -3; p <= 6; p++ {
			s := step * math.Pow(10, float64(p))
			if q := v / s; math.Abs(q-math.Round(q)) < 1e-9 && q <= 10 {
				return true
			}
		}
	}
	return false
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
