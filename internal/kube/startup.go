package kube

import (
	"net/http"
	"sync/atomic"
)

// Startup answers the kubelet's probes while the operator waits for its
// namespace to declare a site it can run (a GridNetwork, the Secrets it
// names): alive, since a restart would not change the namespace, and not
// ready, with the reason. Without it the liveness probe would restart the
// pod over and over until the resources are created. The operator's own
// metrics listener replaces it once the operator starts.
type Startup struct {
	problem atomic.Pointer[string]
}

// Set records why the operator is not running yet. A nil Startup ignores it.
func (s *Startup) Set(problem string) {
	if s != nil {
		s.problem.Store(&problem)
	}
}

// Handler serves /healthz (200) and /readyz (503 and the latest reason).
func (s *Startup) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		reason := "starting"
		if p := s.problem.Load(); p != nil {
			reason = *p
		}
		http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
	})
	return mux
}
