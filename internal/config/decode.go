package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML as a Go duration string
// ("1s", "500ms", "2m"). A bare number is refused, because "5" could mean
// seconds or nanoseconds and configuration must not guess.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String renders the duration the way it is written in configuration.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return fmt.Errorf("line %d: duration must be a string with a unit, like \"1s\" or \"500ms\", got %q", n.Line, n.Value)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: invalid duration %q: %v", n.Line, n.Value, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// document is a decoded YAML file with the line of every key, so that
// validation errors can point at the line that is wrong.
type document struct {
	file  string
	lines map[string]int // field path ("providers[0].metrics.timeout") -> line
	// deprecated says, for each key written in an old spelling the decoder
	// accepted, where it is and what it is now called.
	deprecated []string
}

func (doc *document) at(path string) string {
	if where, ok := doc.line(path); ok {
		return where
	}
	return doc.file
}

// line is path's "file:line", when the key was read from a file.
func (doc *document) line(path string) (string, bool) {
	l, ok := doc.lines[path]
	if !ok {
		return "", false
	}
	return fmt.Sprintf("%s:%d", doc.file, l), true
}

// decodeFile reads file strictly into out: an unknown key, a duplicate key, a
// second YAML document or a type mismatch is an error naming the file and line.
func decodeFile(file string, out any) (*document, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return decodeBytes(file, data, out)
}

func decodeBytes(file string, data []byte, out any) (*document, error) {
	doc := &document{file: file, lines: map[string]int{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return doc, nil // an empty file is all defaults
		}
		return nil, locate(file, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("%s:%d: a config file holds one YAML document, found a second", file, extra.Line)
	}
	body := &root
	if body.Kind == yaml.DocumentNode && len(body.Content) == 1 {
		body = body.Content[0]
	}
	if body.Kind == yaml.ScalarNode && body.Tag == "!!null" {
		return doc, nil
	}
	var errs []error
	checkKeys(file, body, reflect.TypeOf(out).Elem(), "", doc, &errs)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := body.Decode(out); err != nil {
		return nil, locate(file, err)
	}
	return doc, nil
}

var yamlLine = regexp.MustCompile(`^line (\d+): `)

// locate rewrites the decoder's "line N: ..." messages as "file:N: ...".
func locate(file string, err error) error {
	var msgs []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	errs := make([]error, 0, len(msgs))
	for _, m := range msgs {
		m = strings.TrimPrefix(m, "yaml: ")
		if loc := yamlLine.FindStringSubmatch(m); loc != nil {
			errs = append(errs, fmt.Errorf("%s:%s: %s", file, loc[1], m[len(loc[0]):]))
		} else {
			errs = append(errs, fmt.Errorf("%s: %s", file, m))
		}
	}
	return errors.Join(errs...)
}

// checkKeys walks the YAML tree beside the Go type it decodes into and reports
// every key the type does not have, with the file, line and field path. A
// key in a renamed field's old spelling (its `was` tag) is rewritten to the
// new one in the tree, so it decodes, and recorded in doc.deprecated.
func checkKeys(file string, n *yaml.Node, t reflect.Type, path string, doc *document, errs *[]error) {
	lines := doc.lines
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return // the decoder reports the type mismatch with its line
		}
		fields := yamlFields(t)
		renamed := renamedFields(fields)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if now, ok := renamed[k.Value]; ok {
				doc.deprecated = append(doc.deprecated, fmt.Sprintf("%s:%d: %q is deprecated; it is now %q", file, k.Line, joinPath(path, k.Value), joinPath(path, now)))
				k.Value = now
			}
			p := joinPath(path, k.Value)
			if seen[k.Value] {
				*errs = append(*errs, fmt.Errorf("%s:%d: duplicate key %q", file, k.Line, p))
				continue
			}
			seen[k.Value] = true
			f, ok := fields[k.Value]
			if !ok {
				*errs = append(*errs, fmt.Errorf("%s:%d: unknown key %q%s", file, k.Line, p, suggest(k.Value, fields)))
				continue
			}
			lines[p] = k.Line
			checkKeys(file, v, f.Type, p, doc, errs)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			lines[p] = item.Line
			checkKeys(file, item, t.Elem(), p, doc, errs)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := joinPath(path, n.Content[i].Value)
			lines[p] = n.Content[i].Line
			checkKeys(file, n.Content[i+1], t.Elem(), p, doc, errs)
		}
	}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps each YAML key of struct type t to its field.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

// renamedFields maps each old spelling of a renamed key among fields (its
// field's `was` tag) to the key's name now.
func renamedFields(fields map[string]reflect.StructField) map[string]string {
	out := map[string]string{}
	for name, f := range fields {
		if was := f.Tag.Get("was"); was != "" {
			out[was] = name
		}
	}
	return out
}

// suggest names the closest known key when the unknown one looks like a typo.
func suggest(key string, fields map[string]reflect.StructField) string {
	best, bestDist := "", 3
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if d := editDistance(strings.ToLower(key), strings.ToLower(name)); d < bestDist {
			best, bestDist = name, d
		}
	}
	if best == "" {
		return " (known keys: " + strings.Join(names, ", ") + ")"
	}
	return " (did you mean " + strconv.Quote(best) + "?)"
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// KeyPaths lists every YAML key path a config type accepts, with list
// elements written as "[]" (for example "providers[].metrics.timeout"). The
// documentation test uses it to prove docs/configuration.md covers them all.
func KeyPaths(v any) []string {
	var out []string
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() == reflect.Slice {
			walk(t.Elem(), path+"[]")
			return
		}
		if t.Kind() != reflect.Struct || reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
			return
		}
		fields := yamlFields(t)
		for name, f := range fields {
			p := joinPath(path, name)
			out = append(out, p)
			walk(f.Type, p)
		}
	}
	walk(reflect.TypeOf(v), "")
	sort.Strings(out)
	return out
}
