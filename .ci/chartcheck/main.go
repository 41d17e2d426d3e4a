// Command chartcheck reads what the Helm chart renders and checks what a
// platform team relies on when it installs it: both pods request CPU and
// memory and limit memory (the gateway sizes its body budget from the
// limit), the gateway replicas have a PodDisruptionBudget and prefer
// different nodes, each pod's grace period outlasts its drain, and the
// operator's Role gets Secrets by name only, never lists or watches them.
//
// Usage: go run ./.ci/chartcheck DEFAULTS_YAML FULL_VALUES_YAML
package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

type rendered struct {
	deployments map[string]*appsv1.Deployment // by component
	pdbs        []*policyv1.PodDisruptionBudget
	roles       []*rbacv1.Role
}

func read(file string) (*rendered, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	r := &rendered{deployments: map[string]*appsv1.Deployment{}}
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		switch head.Kind {
		case "Deployment":
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict(doc, &d); err != nil {
				return nil, err
			}
			r.deployments[d.Spec.Template.Labels["app.kubernetes.io/component"]] = &d
		case "PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			if err := yaml.UnmarshalStrict(doc, &p); err != nil {
				return nil, err
			}
			r.pdbs = append(r.pdbs, &p)
		case "Role":
			var role rbacv1.Role
			if err := yaml.UnmarshalStrict(doc, &role); err != nil {
				return nil, err
			}
			r.roles = append(r.roles, &role)
		}
	}
	return r, nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: chartcheck DEFAULTS_YAML FULL_VALUES_YAML")
		os.Exit(2)
	}
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for i, file := range os.Args[1:] {
		r, err := read(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chartcheck:", err)
			os.Exit(1)
		}
		for _, component := range []string{"gateway", "operator"} {
			d := r.deployments[component]
			if d == nil {
				fail("%s: no %s Deployment", file, component)
				continue
			}
			pod := d.Spec.Template.Spec
			c := pod.Containers[0]
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				fail("%s: %s: resources %+v: want CPU and memory requests and a memory limit", file, component, c.Resources)
			}
			drain := time.Duration(0)
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--drain-timeout="); ok {
					drain, _ = time.ParseDuration(v)
				}
			}
			if drain == 0 || pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second <= drain {
				fail("%s: %s: grace period %v does not outlast the drain %v", file, component, pod.TerminationGracePeriodSeconds, drain)
			}
		}
		if gw := r.deployments["gateway"]; gw != nil && i == 0 {
			aff := gw.Spec.Template.Spec.Affinity
			if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 ||
				aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != corev1.LabelHostname {
				fail("%s: the gateway replicas do not prefer different nodes: %+v", file, aff)
			}
			covered := false
			for _, p := range r.pdbs {
				covered = covered || p.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == "gateway"
			}
			if !covered {
				fail("%s: no PodDisruptionBudget covers the gateway replicas", file)
			}
		}
		for _, role := range r.roles {
			for _, rule := range role.Rules {
				if !slices.Contains(rule.Resources, "secrets") {
					continue
				}
				if len(rule.ResourceNames) == 0 || !slices.Equal(rule.Verbs, []string{"get"}) {
					fail("%s: Role %s: secrets %v on %v, want get on named Secrets only", file, role.Name, rule.Verbs, rule.ResourceNames)
				}
				want := []string{"grid-ca", "grid-site"}
				if i == 1 {
					want = append(want, "grid-gossip", "epp-metrics-token")
				}
				for _, n := range want {
					if !slices.Contains(rule.ResourceNames, n) {
						fail("%s: Role %s: Secret %s, which the values name, is not among %v", file, role.Name, n, rule.ResourceNames)
					}
				}
			}
		}
	}
	if len(problems) > 0 {
		fmt.Fprintln(os.Stderr, "chartcheck:\n  "+strings.Join(problems, "\n  "))
		os.Exit(1)
	}
	fmt.Println("chartcheck: resources, disruption budget, anti-affinity, grace periods and Secret access as expected")
}
