package v1alpha1

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestEveryFieldDocumented: every field of every generated CRD's spec and
// status is described in docs/kubernetes.md.
func TestEveryFieldDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../../deploy/crds/*.yaml")
	if len(files) != 3 {
		t.Fatalf("%d CRDs in deploy/crds, want 3", len(files))
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Versions []struct {
					Schema struct {
						OpenAPIV3Schema crdSchema `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var paths []string
		root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
		for _, top := range []string{"spec", "status"} {
			if s, ok := root.Properties[top]; ok {
				s.walk(top, &paths)
			}
		}
		sort.Strings(paths)
		for _, p := range paths {
			if !strings.Contains(string(doc), "`"+p+"`") {
				t.Errorf("docs/kubernetes.md does not document %s (%s)", p, filepath.Base(f))
			}
		}
	}
}

type crdSchema struct {
	Properties map[string]crdSchema `json:"properties"`
}

// walk lists the field paths below s; a condition's own fields are
// metav1.Condition's, documented as a whole.
func (s crdSchema) walk(path string, out *[]string) {
	for name, p := range s.Properties {
		child := path + "." + name
		*out = append(*out, child)
		if child != "status.conditions" {
			p.walk(child, out)
		}
	}
}
