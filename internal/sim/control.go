package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"
)

// control is the state tests and the demo change through /sim/control.
type control struct {
	// ReadyEndpoints overrides how many endpoints the EPP reports fresh; nil
	// reports the truth.
	ReadyEndpoints *int `json:"readyEndpoints"`
	// ErrorRate is the share of API requests answered 500.
	ErrorRate float64 `json:"errorRate"`
	// MetricsDelay delays every /metrics answer.
	MetricsDelay string `json:"metricsDelay"`
	// MetricsHang makes /metrics never answer.
	MetricsHang bool `json:"metricsHang"`
	// Oversize pads /metrics past 1 MiB.
	Oversize bool `json:"oversize"`
	// LoadsStatus, when non-zero, is the status /v1/loads answers instead.
	LoadsStatus int `json:"loadsStatus"`
	// Slots is each engine's concurrency.
	Slots int `json:"slots"`
	// Endpoints is the number of engines (0 drains an EPP pool).
	Endpoints int `json:"endpoints"`
	// Down answers 503 on every route but this one.
	Down bool `json:"down"`

	metricsDelay time.Duration
}

// controlView is what GET /sim/control answers.
type controlView struct {
	control
	Hits map[string]int64 `json:"hits"`
	// Engines is each engine's live state, for tests that check the model.
	Engines []engineView `json:"engines"`
}

type engineView struct {
	Name    string  `json:"name"`
	Running int     `json:"running"`
	Waiting int     `json:"waiting"`
	Slots   int     `json:"slots"`
	KVUsage float64 `json:"kvUsage"`
}

func (s *Sim) state() control {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.control
}

func (s *Sim) handleControlGet(w http.ResponseWriter, r *http.Request) {
	v := controlView{control: s.state(), Hits: s.hitCounts()}
	for _, e := range s.Engines() {
		l := e.Load()
		v.Engines = append(v.Engines, engineView{e.name, l.Running, l.Waiting, l.Slots, l.KVUsage()})
	}
	writeJSON(w, http.StatusOK, v)
}

// controlFields are the keys POST /sim/control accepts.
var controlFields = []string{"readyEndpoints", "errorRate", "metricsDelay", "metricsHang", "oversize", "loadsStatus", "slots", "endpoints", "down"}

func (s *Sim) handleControlPost(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		controlError(w, fmt.Sprintf("read body: %v", err))
		return
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		controlError(w, fmt.Sprintf("body must be a JSON object: %v", err))
		return
	}
	var unknown []string
	for k := range raw {
		if !slices.Contains(controlFields, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		controlError(w, fmt.Sprintf("unknown field(s) %s; known: %s", strings.Join(unknown, ", "), strings.Join(controlFields, ", ")))
		return
	}

	s.mu.Lock()
	next := s.control
	s.mu.Unlock()
	if err := applyControl(&next, raw, s.opts.Kind); err != nil {
		controlError(w, err.Error())
		return
	}
	s.setControl(next)
	s.handleControlGet(w, r)
}

// applyControl decodes each present field into c, validating it.
func applyControl(c *control, raw map[string]json.RawMessage, kind string) error {
	dec := func(key string, into any) error {
		d := json.NewDecoder(bytes.NewReader(raw[key]))
		if err := d.Decode(into); err != nil {
			return fmt.Errorf("%s: %v", key, err)
		}
		return nil
	}
	if v, ok := raw["readyEndpoints"]; ok {
		if string(v) == "null" {
			c.ReadyEndpoints = nil
		} else {
			var n int
			if err := dec("readyEndpoints", &n); err != nil {
				return err
			}
			if n < 0 {
				return fmt.Errorf("readyEndpoints must be null or at least 0, got %d", n)
			}
			c.ReadyEndpoints = &n
		}
	}
	if _, ok := raw["errorRate"]; ok {
		if err := dec("errorRate", &c.ErrorRate); err != nil {
			return err
		}
		if !(c.ErrorRate >= 0 && c.ErrorRate <= 1) {
			return fmt.Errorf("errorRate must be in [0, 1], got %g", c.ErrorRate)
		}
	}
	if _, ok := raw["metricsDelay"]; ok {
		if err := dec("metricsDelay", &c.MetricsDelay); err != nil {
			return err
		}
		d, err := time.ParseDuration(c.MetricsDelay)
		if c.MetricsDelay == "" {
			d, err = 0, nil
		}
		if err != nil || d < 0 {
			return fmt.Errorf("metricsDelay must be a non-negative duration like \"500ms\", got %q", c.MetricsDelay)
		}
		c.metricsDelay = d
	}
	for _, b := range []struct {
		key string
		p   *bool
	}{{"metricsHang", &c.MetricsHang}, {"oversize", &c.Oversize}, {"down", &c.Down}} {
		if _, ok := raw[b.key]; ok {
			if err := dec(b.key, b.p); err != nil {
				return err
			}
		}
	}
	if _, ok := raw["loadsStatus"]; ok {
		if err := dec("loadsStatus", &c.LoadsStatus); err != nil {
			return err
		}
		if c.LoadsStatus != 0 && (c.LoadsStatus < 200 || c.LoadsStatus > 599) {
			return fmt.Errorf("loadsStatus must be 0 (normal) or an HTTP status 200-599, got %d", c.LoadsStatus)
		}
	}
	if _, ok := raw["slots"]; ok {
		if err := dec("slots", &c.Slots); err != nil {
			return err
		}
		if c.Slots < 1 {
			return fmt.Errorf("slots must be at least 1, got %d", c.Slots)
		}
	}
	if _, ok := raw["endpoints"]; ok {
		if err := dec("endpoints", &c.Endpoints); err != nil {
			return err
		}
		least := 1
		if kind == KindEPP {
			least = 0 // an EPP pool can drain completely
		}
		if c.Endpoints < least || c.Endpoints > 1024 {
			return fmt.Errorf("endpoints must be in [%d, 1024], got %d", least, c.Endpoints)
		}
	}
	return nil
}

// setControl applies a validated control state, resizing the engines.
func (s *Sim) setControl(c control) {
	s.mu.Lock()
	old := s.control
	s.control = c
	for len(s.engines) < c.Endpoints {
		s.engines = append(s.engines, s.newEngine(len(s.engines)))
	}
	// Removed engines finish what they run; they just take no new work.
	s.engines = s.engines[:c.Endpoints]
	engines := append([]*Engine(nil), s.engines...)
	s.mu.Unlock()
	if c.Slots != old.Slots {
		for _, e := range engines {
			e.setSlots(c.Slots)
		}
	}
	s.dispatchHeld()
	s.log.Info("sim control changed", "state", c)
}

// LogValue writes the control state as values: readyEndpoints as its number,
// or "truth" when the EPP reports what its engines are.
func (c control) LogValue() slog.Value {
	ready := slog.StringValue("truth")
	if c.ReadyEndpoints != nil {
		ready = slog.IntValue(*c.ReadyEndpoints)
	}
	return slog.GroupValue(
		slog.Attr{Key: "readyEndpoints", Value: ready},
		slog.Float64("errorRate", c.ErrorRate), slog.String("metricsDelay", c.MetricsDelay),
		slog.Bool("metricsHang", c.MetricsHang), slog.Bool("oversize", c.Oversize),
		slog.Int("loadsStatus", c.LoadsStatus), slog.Int("slots", c.Slots),
		slog.Int("endpoints", c.Endpoints), slog.Bool("down", c.Down))
}

func controlError(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
