package gateway

import (
	"testing"

	"github.com/grid-inference/grid/internal/config"
	"github.com/grid-inference/grid/internal/route"
)

// TestPolicyNamesAgree: every policy route makes is a value the
// configuration accepts, the configuration's default is route's default,
// and a name the configuration refuses is one route does not make. The
// names live in two packages (config may not import the gateway side), so
// this test is where they must agree.
func TestPolicyNamesAgree(t *testing.T) {
	base := "site: east\ntls: {ca: a, cert: b, key: c}\noperator: {signals: 'https://o:1'}\n"
	def, err := config.ParseGateway("gw.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if def.Availability.Policy != route.PolicyNames[0] {
		t.Errorf("the configuration's default policy %q, route's %q", def.Availability.Policy, route.PolicyNames[0])
	}
	for _, name := range append([]string{"least-loaded"}, route.PolicyNames...) {
		_, cfgErr := config.ParseGateway("gw.yaml", []byte(base+"availability: {policy: "+name+"}\n"))
		p, routeErr := route.NewPolicy(name, &route.Service{})
		if (cfgErr == nil) != (routeErr == nil) {
			t.Errorf("policy %q: configuration says %v, route says %v", name, cfgErr, routeErr)
		}
		if routeErr == nil && p.Name() != name {
			t.Errorf("route.NewPolicy(%q) is named %q", name, p.Name())
		}
	}
}
