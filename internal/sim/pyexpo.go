package sim

import (
	"bufio"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// pyExposition renders metrics exactly as Python's prometheus_client does, so
// the vLLM and SGLang sims are indistinguishable from the real servers: float
// values in Python's repr ("14.0", "5.5153934e+07"), labels sorted, counters
// declared with their _total name, and the OpenMetrics escaping bug of
// prometheus_client >= 0.23 (samples underscored, HELP/TYPE keep the colon).
type pyExposition struct {
	families []*pyFamily
	byName   map[string]*pyFamily
}

type pyFamily struct {
	name    string // the declared name; for counters without _total
	typ     string // gauge, counter, histogram
	help    string
	samples []pySample
}

type pySample struct {
	name   string
	labels []pyLabel
	value  float64
}

type pyLabel struct{ name, value string }

func newPyExposition() *pyExposition { return &pyExposition{byName: map[string]*pyFamily{}} }

func (x *pyExposition) family(name, typ, help string) *pyFamily {
	if f, ok := x.byName[name]; ok {
		return f
	}
	f := &pyFamily{name: name, typ: typ, help: help}
	x.families = append(x.families, f)
	x.byName[name] = f
	return f
}

// labels turns alternating name/value pairs into a sorted label set.
func labels(kv ...string) []pyLabel {
	out := make([]pyLabel, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, pyLabel{kv[i], kv[i+1]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func withLabel(ls []pyLabel, name, value string) []pyLabel {
	out := append(append([]pyLabel(nil), ls...), pyLabel{name, value})
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// gauge adds one gauge sample; help defaults to the upstream text.
func (x *pyExposition) gauge(name string, ls []pyLabel, v float64) {
	f := x.family(name, "gauge", helpText[name])
	f.samples = append(f.samples, pySample{name, ls, v})
}

// counter adds a counter sample named base_total; withCreated also adds the
// base_created gauge family a single-process registry exposes.
func (x *pyExposition) counter(base string, ls []pyLabel, v float64, created float64, withCreated bool) {
	f := x.family(base, "counter", helpText[base+"_total"])
	f.samples = append(f.samples, pySample{base + "_total", ls, v})
	if withCreated {
		x.createdGauge(base, ls, created)
	}
}

func (x *pyExposition) createdGauge(base string, ls []pyLabel, created float64) {
	name := base + "_created"
	help := helpText[base+"_total"]
	if help == "" {
		help = helpText[base]
	}
	f := x.family(name, "gauge", help)
	f.samples = append(f.samples, pySample{name, ls, created})
}

// histogram adds a histogram. sumFirst selects the multiprocess order (SGLang:
// _sum, buckets, _count) over the single-process one (vLLM: buckets, _count,
// _sum).
func (x *pyExposition) histogram(name string, ls []pyLabel, h *histogram, sumFirst bool) {
	f := x.family(name, "histogram", helpText[name])
	if sumFirst {
		f.samples = append(f.samples, pySample{name + "_sum", ls, h.sum})
	}
	cum := h.cumulative()
	for i, c := range cum {
		le := "+Inf"
		if i < len(h.bounds) {
			le = pyFloat(h.bounds[i])
		}
		f.samples = append(f.samples, pySample{name + "_bucket", withLabel(ls, "le", le), float64(c)})
	}
	f.samples = append(f.samples, pySample{name + "_count", ls, float64(h.count)})
	if !sumFirst {
		f.samples = append(f.samples, pySample{name + "_sum", ls, h.sum})
	}
}

// render writes the exposition. openMetrics selects the escaped OpenMetrics
// form prometheus_client answers to an Accept without escaping=allow-utf-8.
func (x *pyExposition) render(w io.Writer, openMetrics bool) error {
	bw := bufio.NewWriter(w)
	for _, f := range x.families {
		declared := f.name
		if f.typ == "counter" && !openMetrics {
			declared += "_total"
		}
		bw.WriteString("# HELP " + declared + " " + escapeHelp(f.help) + "\n")
		bw.WriteString("# TYPE " + declared + " " + f.typ + "\n")
		for _, s := range f.samples {
			name := s.name
			if openMetrics {
				name = strings.ReplaceAll(name, ":", "_")
			}
			bw.WriteString(name)
			if len(s.labels) > 0 {
				bw.WriteByte('{')
				for i, l := range s.labels {
					if i > 0 {
						bw.WriteByte(',')
					}
					bw.WriteString(l.name + `="` + escapeLabel(l.value) + `"`)
				}
				bw.WriteByte('}')
			}
			bw.WriteString(" " + pyFloat(s.value) + "\n")
		}
	}
	if openMetrics {
		bw.WriteString("# EOF\n")
	}
	return bw.Flush()
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// pyFloat formats v as prometheus_client's floatToGoString does: Python's
// repr, switched to an exponent sooner for large positive values.
func pyFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	s := pyRepr(v)
	dot := strings.IndexByte(s, '.')
	if v > 0 && dot > 6 {
		mantissa := strings.TrimRight(s[:1]+"."+s[1:dot]+s[dot+1:], "0.")
		return mantissa + "e+0" + strconv.Itoa(dot-1)
	}
	return s
}

// pyRepr is Python's repr of a float: the shortest round-trip digits, fixed
// notation between 1e-4 and 1e16 (always with a fraction), exponent outside.
func pyRepr(v float64) string {
	if a := math.Abs(v); a == 0 || (a >= 1e-4 && a < 1e16) {
		s := strconv.FormatFloat(v, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	return strconv.FormatFloat(v, 'e', -1, 64)
}
