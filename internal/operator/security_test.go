package operator

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/signals"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestServingDocumentIsLocalOnly: the serving document (this site's
// providers' upstream addresses and its peers' gateways) is read by the
// site's own gateway only; a peer gets 403.
func TestServingDocumentIsLocalOnly(t *testing.T) {
	dir := pki(t, "east", "west")
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1")
	if resp, body, err := get(t, idSource(t, dir, "east"), "east", east.addr, signals.ServingPath); err != nil || resp.StatusCode != 200 {
		t.Fatalf("Local: %v %v %s", err, resp, body)
	}
	if resp, _, err := get(t, idSource(t, dir, "west"), "east", east.addr, signals.ServingPath); err != nil || resp.StatusCode != 403 {
		t.Errorf("a peer read the serving document: %v %v", err, resp)
	}
}

// TestMetricsListenerCap: the plain operations listener holds at most
// MetricsConns connections; the next is closed at accept and counted.
func TestMetricsListenerCap(t *testing.T) {
	dir := pki(t, "east")
	east := startSite(t, dir, "east", t.TempDir(), "", nil)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, ln := east.op.MetricsServer(raw, nil)
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	defer func() { srv.Close(); <-done }()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range MetricsConns {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	over, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("connection %d over the cap: %v, want closed", MetricsConns+1, err)
	}
	if v := testutil.ToFloat64(east.op.m.metricsShed); v != 1 {
		t.Errorf("sheds counted: %v", v)
	}
}
