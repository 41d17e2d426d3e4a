package operator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grid-inference/grid/internal/signals"
)

// reportsFile keeps each gateway replica's latest report across restarts.
const reportsFile = "gateway-reports.json"

// maxReplicas bounds the replicas remembered; the oldest clean ones go first.
const maxReplicas = 64

// replicaReport is one gateway replica's latest report.
type replicaReport struct {
	Sequence uint64    `json:"sequence"`
	Bad      bool      `json:"bad"`
	Updated  time.Time `json:"updated"`
}

// gatewayReports is the GatewayAgesRejected state: it stands while any
// replica's latest report is bad. Silence, the replica's replacement and an
// operator restart do not clear it; only a later clean report of the same
// replica does.
type gatewayReports struct {
	path     string
	mu       sync.Mutex
	replicas map[string]*replicaReport
	gauge    prometheus.Gauge
}

func loadGatewayReports(dir string, reg *prometheus.Registry) (*gatewayReports, error) {
	g := &gatewayReports{
		path:     filepath.Join(dir, reportsFile),
		replicas: map[string]*replicaReport{},
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grid_gateway_ages_rejected",
			Help: "1 while some gateway replica of this site reports signal rows dropped for implausible age (GatewayAgesRejected)."}),
	}
	reg.MustRegister(g.gauge)
	data, err := os.ReadFile(g.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read gateway reports: %w", err)
	default:
		if err := json.Unmarshal(data, &g.replicas); err != nil {
			return nil, fmt.Errorf("gateway reports %s are corrupt (%v): delete the file to forget every replica's evidence", g.path, err)
		}
	}
	g.publish()
	return g, nil
}

func (g *gatewayReports) publish() {
	v := 0.0
	for _, r := range g.replicas {
		if r.Bad {
			v = 1
		}
	}
	g.gauge.Set(v)
}

// record applies a report: a newer sequence of a replica replaces its state,
// an older one is ignored (it is still acknowledged: the gateway may stop
// resending it).
func (g *gatewayReports) record(rep signals.Report, now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.replicas[rep.Epoch]
	if cur != nil && rep.Sequence <= cur.Sequence {
		return nil
	}
	g.replicas[rep.Epoch] = &replicaReport{Sequence: rep.Sequence, Bad: rep.Observed == signals.ObservedBad, Updated: now}
	g.evict()
	g.publish()
	data, err := json.MarshalIndent(g.replicas, "", "  ")
	if err != nil {
		return err
	}
	return writeDurably(g.path, data)
}

// evict keeps at most maxReplicas, dropping the oldest clean replicas
// first, then the oldest of any.
func (g *gatewayReports) evict() {
	for len(g.replicas) > maxReplicas {
		type kv struct {
			epoch string
			r     *replicaReport
		}
		all := make([]kv, 0, len(g.replicas))
		for e, r := range g.replicas {
			all = append(all, kv{e, r})
		}
		sort.Slice(all, func(i, j int) bool {
			if all[i].r.Bad != all[j].r.Bad {
				return !all[i].r.Bad
			}
			return all[i].r.Updated.Before(all[j].r.Updated)
		})
		delete(g.replicas, all[0].epoch)
	}
}

// Rejected lists the replicas whose latest report is bad.
func (g *gatewayReports) Rejected() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for e, r := range g.replicas {
		if r.Bad {
			out = append(out, e)
		}
	}
	sort.Strings(out)
	return out
}

// serveFeedback takes a rejection report from this site's gateway (the
// Local caller only) and acknowledges it with 204 echoing epoch and
// sequence.
func (o *Operator) serveFeedback(w http.ResponseWriter, r *http.Request) {
	if !o.localOnly(http.MethodPost, w, r) {
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, signals.MaxFeedbackBytes+1))
	if err != nil {
		http.Error(w, "read report", http.StatusBadRequest)
		return
	}
	rep, err := signals.DecodeReport(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := o.reports.record(rep, o.clk.Now()); err != nil {
		o.log.Error("could not keep a gateway report", "err", err)
		http.Error(w, "could not keep the report", http.StatusInternalServerError)
		return
	}
	if rep.Observed == signals.ObservedBad {
		o.log.Warn("the gateway drops signal rows for implausible age (GatewayAgesRejected); check this site's and its peers' clocks",
			"gateway_epoch", rep.Epoch, "skew_dropped_total", rep.SkewTotal)
	}
	w.Header().Set(signals.FeedbackEpochHeader, rep.Epoch)
	w.Header().Set(signals.FeedbackSequenceHeader, strconv.FormatUint(rep.Sequence, 10))
	w.WriteHeader(http.StatusNoContent)
}

// GatewayAgesRejected lists the gateway replicas whose latest report is bad.
func (o *Operator) GatewayAgesRejected() []string { return o.reports.Rejected() }
