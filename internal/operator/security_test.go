package operator

import (
	"testing"
)

// TestServingDocumentIsLocalOnly: the serving document (this site's
// providers' upstream addresses and its peers' gateways) is read by the
// site's own gateway only; a peer gets 403.
func TestServingDocumentIsLocalOnly(t *testing.T) {
	dir := pki(t, "east", "west")
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "west=https://127.0.0.1:1")
	if resp, body, err := get(t, idSource(t, dir, "east"), "east", east.addr, ServingPath); err != nil || resp.StatusCode != 200 {
		t.Fatalf("Local: %v %v %s", err, resp, body)
	}
	if resp, _, err := get(t, idSource(t, dir, "west"), "east", east.addr, ServingPath); err != nil || resp.StatusCode != 403 {
		t.Errorf("a peer read the serving document: %v %v", err, resp)
	}
}
