// Command kubeschema writes the JSON schemas kubeconform validates against,
// offline: Kubernetes' own from the swagger.json of the k8s.io/kubernetes
// module (fetched through the Go module proxy, the only registry CI
// reaches), and Grid's from its CRDs. One file per kind, named as
// kubeconform's default location names them
// ({kind}-{group}-{version}.json, lowercase, group's first label only for
// built-in groups), strict: objects that list their properties refuse
// others, as `kubeconform -strict` expects of its strict schemas.
//
// Usage: go run ./.ci/kubeschema SWAGGER_JSON OUT_DIR [CRD_YAML...]
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: kubeschema SWAGGER_JSON OUT_DIR [CRD_YAML...]")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubeschema:", err)
		os.Exit(1)
	}
}

func run(swaggerFile, out string, crds []string) error {
	raw, err := os.ReadFile(swaggerFile)
	if err != nil {
		return err
	}
	var swagger struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &swagger); err != nil {
		return fmt.Errorf("%s: %w", swaggerFile, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	defs := map[string]any{}
	for name, d := range swagger.Definitions {
		defs[name] = strict(rewriteRefs(d))
	}
	if err := writeJSON(filepath.Join(out, "_definitions.json"), map[string]any{"definitions": defs}); err != nil {
		return err
	}
	kinds := 0
	for name, d := range swagger.Definitions {
		gvks, _ := d["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk := g.(map[string]any)
			group := gvk["group"].(string)
			if group != "" {
				// kubeconform's default names use the group's first label
				// for built-in groups: apps, networking, rbac, ...
				if strings.HasSuffix(group, ".k8s.io") {
					group = strings.TrimSuffix(group, ".k8s.io")
				}
				group = strings.Split(group, ".")[0]
			}
			if err := writeKind(out, gvk["kind"].(string), group, gvk["version"].(string), defs[name]); err != nil {
				return err
			}
			kinds++
		}
	}
	for _, file := range crds {
		n, err := crdSchemas(file, out)
		if err != nil {
			return err
		}
		kinds += n
	}
	fmt.Printf("kubeschema: %d kinds written to %s\n", kinds, out)
	return nil
}

func writeKind(out, kind, group, version string, schema any) error {
	name := strings.ToLower(kind)
	if group != "" {
		name += "-" + strings.ToLower(group)
	}
	name += "-" + strings.ToLower(version) + ".json"
	return writeJSON(filepath.Join(out, name), schema)
}

// crdSchemas writes a CRD's versions' schemas, named with the CRD's full
// group, as kubeconform names custom resources.
func crdSchemas(file, out string) (int, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	var crd struct {
		Spec struct {
			Group string `json:"group"`
			Names struct {
				Kind string `json:"kind"`
			} `json:"names"`
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		return 0, fmt.Errorf("%s: %w", file, err)
	}
	for _, v := range crd.Spec.Versions {
		s := strict(v.Schema.OpenAPIV3Schema).(map[string]any)
		name := fmt.Sprintf("%s-%s-%s.json", strings.ToLower(crd.Spec.Names.Kind), strings.Split(crd.Spec.Group, ".")[0], v.Name)
		if err := writeJSON(filepath.Join(out, name), s); err != nil {
			return 0, err
		}
	}
	return len(crd.Spec.Versions), nil
}

// rewriteRefs points swagger's local references at the shared definitions
// file.
func rewriteRefs(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if s, ok := e.(string); ok && k == "$ref" {
				out[k] = strings.Replace(s, "#/definitions/", "_definitions.json#/definitions/", 1)
				continue
			}
			out[k] = rewriteRefs(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = rewriteRefs(e)
		}
		return out
	}
	return v
}

// strict makes every object schema that lists properties refuse others,
// unless it says unknown fields are preserved; and lets an int-or-string
// be either, as the API server does (swagger types it a string).
func strict(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = strict(e)
		}
		intOrString, _ := x["x-kubernetes-int-or-string"].(bool)
		if x["format"] == "int-or-string" || intOrString {
			delete(x, "type")
			delete(x, "format")
			x["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		}
		_, hasProps := x["properties"]
		_, hasAdditional := x["additionalProperties"]
		if preserve, _ := x["x-kubernetes-preserve-unknown-fields"].(bool); hasProps && !hasAdditional && !preserve {
			x["additionalProperties"] = false
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = strict(e)
		}
		return x
	}
	return v
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
