package gateway

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The dashboard's history: what the gateway believed of each site, at most
// one point per historyStep (the snapshot of the first rebuild after a
// step has passed, with what was counted since the previous point), for
// the last historyWindow, kept on the server so that a page opened late
// shows it; with the refusals it answered, the time to first token it saw
// per site, and notes (the demo's story). Rebuilds come several times a
// second under load, so the window is kept by time, not by a count of
// rebuilds. Bounded: historyWindow/historyStep points, historyNotes notes,
// ttftSamples samples per site between two points.
const (
	historyWindow = 5 * time.Minute
	historyStep   = time.Second
	historyNotes  = 100
	ttftSamples   = 256

	historyMaxPoints = int(historyWindow/historyStep) + 1
)

// HistoryView is the JSON of GET /api/history.
type HistoryView struct {
	Site   string         `json:"site"`
	Points []HistoryPoint `json:"points"`
	Notes  []HistoryNote  `json:"notes"`
}

// HistoryPoint is one rebuild's view.
type HistoryPoint struct {
	AtMs  int64                `json:"atMs"`
	Sites map[string]SitePoint `json:"sites"`
	// Shed and Unavailable are the requests answered 429 and 503 since
	// the previous point.
	Shed        uint64 `json:"shed"`
	Unavailable uint64 `json:"unavailable"`
}

// SitePoint is one site at one point; unmeasured values are null.
type SitePoint struct {
	Rho      *float64 `json:"rho"`
	InFlight *float64 `json:"inFlight"`
	Ceiling  *float64 `json:"ceiling"`
	Ready    bool     `json:"ready"`
	// Picks are the requests routed to the site since the previous point.
	Picks uint64 `json:"picks"`
	// TTFT quantiles, seconds, of the streams that started answering since
	// the previous point: the time from sending to the first byte of the
	// answer's body.
	TTFTp50 *float64 `json:"ttftP50"`
	TTFTp99 *float64 `json:"ttftP99"`
}

// HistoryNote is a note shown with the history.
type HistoryNote struct {
	AtMs int64  `json:"atMs"`
	Text string `json:"text"`
}

// history is the ring. Any goroutine may touch it, under mu, but for the
// encoded answer, which readers load without it.
type history struct {
	mu     sync.Mutex
	points []HistoryPoint
	notes  []HistoryNote
	// version counts the changes to points and notes (mu): an encoded
	// answer of an older version is stale.
	version uint64
	// since the last point:
	ttft        map[string][]float64
	picks       map[string]uint64 // cumulative picks at the last point
	shed, unavl uint64

	// encoded is the latest encoded answer; encodeMu makes one reader
	// encode a new version while the others wait for it, and encodes
	// counts the encodings (tests). The dashboard's reads cost one
	// encoding per point, however many clients ask: 50 clients polling
	// it cost 3.1 s of the gateway's CPU in 15 s when each was encoded.
	encoded  atomic.Pointer[encodedHistory]
	encodeMu sync.Mutex
	encodes  atomic.Uint64
}

// encodedHistory is GET /api/history's body for one version and site.
type encodedHistory struct {
	version uint64
	site    string
	body    []byte
}

func newHistory() *history {
	return &history{ttft: map[string][]float64{}, picks: map[string]uint64{}}
}

// firstByte records a time to first byte of a site's answer.
func (h *history) firstByte(site string, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.ttft[site]; len(s) < ttftSamples {
		h.ttft[site] = append(s, d.Seconds())
	}
}

// refused counts an answered refusal by status.
func (h *history) refused(status int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch status {
	case http.StatusTooManyRequests:
		h.shed++
	case http.StatusServiceUnavailable:
		h.unavl++
	}
}

// record appends the point of a view, closing the interval, unless the
// previous point is less than historyStep old: then the interval stays
// open and this view is not kept.
func (h *history) record(v SnapshotView, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.points); n > 0 {
		if since := at.UnixMilli() - h.points[n-1].AtMs; since >= 0 && since < historyStep.Milliseconds() {
			return
		}
	}
	p := HistoryPoint{AtMs: at.UnixMilli(), Sites: map[string]SitePoint{}, Shed: h.shed, Unavailable: h.unavl}
	for _, c := range v.Sites {
		if _, seen := p.Sites[c.Site]; seen {
			continue
		}
		sp := SitePoint{Rho: c.Rho, InFlight: c.InFlight, Ceiling: c.Ceiling, Ready: c.Ready, Picks: v.Picks[c.Site] - h.picks[c.Site]}
		if s := h.ttft[c.Site]; len(s) > 0 {
			slices.Sort(s)
			q := func(f float64) *float64 { v := s[min(len(s)-1, int(f*float64(len(s))))]; return &v }
			sp.TTFTp50, sp.TTFTp99 = q(0.5), q(0.99)
		}
		p.Sites[c.Site] = sp
	}
	h.points = append(h.points, p)
	h.version++
	// A wall clock set back keeps points the window cannot age out: the
	// count bounds them too.
	drop := max(olderThan(h.points, p.AtMs-historyWindow.Milliseconds(), func(p HistoryPoint) int64 { return p.AtMs }),
		len(h.points)-historyMaxPoints)
	h.points = slices.Delete(h.points, 0, drop)
	for site, n := range v.Picks {
		h.picks[site] = n
	}
	clear(h.ttft)
	h.shed, h.unavl = 0, 0
}

// note adds a note.
func (h *history) note(text string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notes = append(h.notes, HistoryNote{AtMs: at.UnixMilli(), Text: text})
	h.version++
	h.notes = slices.Delete(h.notes, 0, olderThan(h.notes, at.UnixMilli()-historyWindow.Milliseconds(), func(n HistoryNote) int64 { return n.AtMs }))
	if len(h.notes) > historyNotes {
		h.notes = slices.Delete(h.notes, 0, len(h.notes)-historyNotes)
	}
}

// olderThan is how many of items, oldest first, are older than oldestMs.
func olderThan[T any](items []T, oldestMs int64, atMs func(T) int64) int {
	n := 0
	for n < len(items) && atMs(items[n]) < oldestMs {
		n++
	}
	return n
}

func (h *history) view(site string) (HistoryView, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HistoryView{Site: site, Points: slices.Clone(h.points), Notes: slices.Clone(h.notes)}, h.version
}

// current is the version the history is at.
func (h *history) current() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.version
}

// answer is the encoded view for site at the history's current version,
// encoded once per version.
func (h *history) answer(site string) []byte {
	fresh := func(e *encodedHistory) bool { return e != nil && e.site == site && e.version == h.current() }
	if e := h.encoded.Load(); fresh(e) {
		return e.body
	}
	h.encodeMu.Lock()
	defer h.encodeMu.Unlock()
	if e := h.encoded.Load(); fresh(e) {
		return e.body
	}
	v, version := h.view(site)
	body, err := json.Marshal(v)
	if err != nil {
		return []byte("{}")
	}
	body = append(body, '\n')
	h.encodes.Add(1)
	h.encoded.Store(&encodedHistory{version: version, site: site, body: body})
	return body
}

// Note adds a note to the dashboard's history (the demo tells its story
// with it).
func (g *Gateway) Note(text string) { g.hist.note(text, g.clk.Now()) }

func (g *Gateway) serveHistory(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(g.hist.answer(g.cfg.Load().Site))
}
