package gateway

import (
	"embed"
	"encoding/json"
	"math"
	"net/http"
	"sync"

	"github.com/grid-inference/grid/internal/route"
)

//go:embed ui/index.html
var uiFiles embed.FS

// SnapshotView is the JSON form of the current snapshot, for the dashboard
// and for tools.
type SnapshotView struct {
	Site     string          `json:"site"`
	BuiltAt  int64           `json:"builtAtMs"`
	Shedding []string        `json:"shedding"`
	Sites    []CandidateView `json:"candidates"`
	// Picks counts requests routed to each site since start.
	Picks map[string]uint64 `json:"picks"`
}

// CandidateView is one candidate; unmeasured values are null.
type CandidateView struct {
	Model    string   `json:"model"`
	Site     string   `json:"site"`
	Provider string   `json:"provider"`
	Local    bool     `json:"local"`
	Ready    bool     `json:"ready"`
	Routable bool     `json:"routable"`
	Queue    *float64 `json:"queue"`
	InFlight *float64 `json:"inFlight"`
	Ceiling  *float64 `json:"ceiling"`
	Weight   *float64 `json:"weight"`
	Rho      *float64 `json:"rho"`
	Full     *bool    `json:"full"`
	// Predicted and Active are the age-aware policy's reading: the
	// predicted present load over capacity, and whether the site is among
	// those drawn from.
	Predicted *float64 `json:"predicted,omitempty"`
	Active    bool     `json:"active"`
	// RoundTripMs is the measured round trip to a remote site's gateway
	// (GET /v1/grid/ping), null before the first measurement and for this
	// site's own providers.
	RoundTripMs *float64 `json:"roundTripMs"`
}

// picks counts routed requests per site.
type picks struct {
	mu sync.Mutex
	n  map[string]uint64
}

func (p *picks) add(site string) {
	p.mu.Lock()
	p.n[site]++
	p.mu.Unlock()
}

func (p *picks) snapshot() map[string]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]uint64, len(p.n))
	for k, v := range p.n {
		out[k] = v
	}
	return out
}

func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// View renders the current snapshot.
func (g *Gateway) View() SnapshotView {
	s := g.builder.Current()
	v := SnapshotView{Site: g.cfg.Load().Site, BuiltAt: s.BuiltAt, Shedding: []string{}, Sites: []CandidateView{}, Picks: g.picks.snapshot()}
	for m := range s.Shedding {
		v.Shedding = append(v.Shedding, m)
	}
	for i := range s.Candidates {
		c := &s.Candidates[i]
		cv := CandidateView{Model: c.Model, Site: c.Site, Provider: c.Provider, Local: c.Local,
			Ready: c.Admission == route.NewAndExisting && !math.IsNaN(c.Score), Routable: c.Upstream != nil, Queue: finite(c.Score)}
		if c.Measured {
			cv.InFlight, cv.Ceiling, cv.Weight, cv.Rho = finite(c.InFlight), finite(c.Ceiling), finite(c.Capacity), finite(c.Rho)
			cv.Predicted = finite(c.Predicted)
		}
		cv.Active = c.Active
		if ms, ok := g.service.RoundTripMs(c.Site); ok && !c.Local {
			cv.RoundTripMs = &ms
		}
		if c.Full != route.Unknown {
			full := c.Full == route.Yes
			cv.Full = &full
		}
		v.Sites = append(v.Sites, cv)
	}
	return v
}

func (g *Gateway) serveView(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(g.View())
}

func serveUI(w http.ResponseWriter, r *http.Request) {
	page, _ := uiFiles.ReadFile("ui/index.html")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	w.Write(page)
}
