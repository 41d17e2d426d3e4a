// Package grafana holds Grid's Grafana dashboard; its test keeps the
// dashboard's queries on series the binaries export.
package grafana

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
}

// TestDashboardQueriesExportedSeries: the dashboard is valid JSON with a
// uid and panels that fit Grafana's 24-column grid, and every grid_* series
// it queries is a name the operator or the gateway defines.
func TestDashboardQueriesExportedSeries(t *testing.T) {
	raw, err := os.ReadFile("grid-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatal("dashboard without uid or panels")
	}
	defined := sourceText(t, "../../internal")
	series := regexp.MustCompile(`\bgrid_[a-z0-9_]+`)
	queried := 0
	for _, p := range dash.Panels {
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 {
			t.Errorf("panel %q: gridPos %+v does not fit 24 columns", p.Title, p.GridPos)
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, name := range series.FindAllString(tg.Expr, -1) {
				queried++
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				if !strings.Contains(defined, `"`+base+`"`) {
					t.Errorf("panel %q queries %s, which no binary exports", p.Title, name)
				}
			}
		}
	}
	if queried < 20 {
		t.Errorf("only %d series queried", queried)
	}
}

// sourceText is the Go source under dir, where every series is named.
func sourceText(t *testing.T, dir string) string {
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		b.Write(src)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
