package gateway

import (
	"net"
	"net/http"
	"testing"
)

// What the external test package's benchmarks share with this package's:
// the held SSE upstream, the raw stream opener, nginx and /proc readers.

// HeldStream is heldStream: an SSE answer of two events, held until
// release closes.
func HeldStream(release <-chan struct{}) http.Handler { return heldStream(release) }

// OpenStreams is openStreams: n streams opened at target, each past its
// first two events.
func OpenStreams(target string, n int) ([]net.Conn, error) { return openStreams(target, n) }

// RaiseFileLimit is raiseFileLimit.
func RaiseFileLimit() { raiseFileLimit() }

// StartNginx is startNginx; it also returns the master's pid.
func StartNginx(b *testing.B, upstream string) (url string, master int) {
	url = startNginx(b, upstream)
	return url, nginxPID
}

// NginxRSS is nginxRSS: the resident memory of the masters and workers.
func NginxRSS(masters ...int) int64 { return nginxRSS(masters...) }

// WatchedHopConns is how many hop connections g's liveness watch holds
// (hoplive.go).
func WatchedHopConns(g *Gateway) int {
	w := g.upstreams.hop
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.conns)
}

// OwnInFlight is how many of g's requests g counts site as holding of
// model (route.Served): its own count.
func OwnInFlight(g *Gateway, site, model string) float64 {
	return g.service.Served(site, model).InFlight()
}

// WaitAllDetached is waitAllDetached: until g copies n detached streams.
func WaitAllDetached(b *testing.B, g *Gateway, n int) { waitAllDetached(b, g, n) }

// BodiesHeld is the request-body bytes g's budget counts now.
func BodiesHeld(g *Gateway) int64 { return g.bodies.used.Load() }
