// Package expo reads and writes the Prometheus text exposition format.
//
// The reader is a filtered, low-allocation scanner built for scraping a few
// series out of large pages: the metric name of each line is checked against
// the caller's filter before anything else is decoded, and labels are decoded
// only when asked for. It accepts what real servers send: names with ':',
// lines without labels, optional timestamps, `# TYPE` lines after their
// samples, and OpenMetrics bodies ending in `# EOF`. Names are matched with
// ':' read as '_', so "vllm:num_requests_running" and the underscored name an
// OpenMetrics-escaping Python exporter sends are the same series.
package expo

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// Sample is one sample line. Its byte slices point into the scanned body and
// into a scratch buffer; they are valid only during the callback.
type Sample struct {
	// Name is the metric name as written.
	Name []byte
	// Value is the sample value; it may be NaN or ±Inf.
	Value float64
	// Timestamp is the optional trailing timestamp in milliseconds.
	Timestamp    int64
	HasTimestamp bool

	labels    []byte // the text between the braces
	hasLabels bool   // the line had a brace-delimited label set (maybe empty)
	scratch   []byte // unescaped label values
}

// HasLabelSet reports whether the line carried braces, even empty ones.
func (s *Sample) HasLabelSet() bool { return s.hasLabels }

// ErrLabels reports a label section that does not parse.
var ErrLabels = errors.New("malformed label set")

// EachLabel calls fn for every label pair in order, with escapes decoded.
// It stops early when fn returns false.
func (s *Sample) EachLabel(fn func(name, value []byte) bool) error {
	b := s.labels
	for {
		b = trimLeft(b)
		if len(b) == 0 {
			return nil
		}
		i := 0
		for i < len(b) && isLabelNameByte(b[i]) {
			i++
		}
		if i == 0 {
			return ErrLabels
		}
		name := b[:i]
		b = trimLeft(b[i:])
		if len(b) == 0 || b[0] != '=' {
			return ErrLabels
		}
		b = trimLeft(b[1:])
		if len(b) == 0 || b[0] != '"' {
			return ErrLabels
		}
		value, rest, ok := s.quoted(b[1:])
		if !ok {
			return ErrLabels
		}
		if !fn(name, value) {
			return nil
		}
		b = trimLeft(rest)
		if len(b) > 0 {
			if b[0] != ',' {
				return ErrLabels
			}
			b = b[1:]
		}
	}
}

// Label returns the value of one label, decoded, or false when absent.
func (s *Sample) Label(name string) ([]byte, bool) {
	var out []byte
	found := false
	err := s.EachLabel(func(n, v []byte) bool {
		if string(n) == name {
			out, found = v, true
			return false
		}
		return true
	})
	return out, found && err == nil
}

// quoted reads a label value after its opening quote and returns the
// unescaped value and what follows the closing quote. A value without escapes
// is returned in place; an escaped one is decoded into the sample's scratch.
func (s *Sample) quoted(b []byte) (value, rest []byte, ok bool) {
	end := bytes.IndexByte(b, '"')
	esc := bytes.IndexByte(b, '\\')
	if end >= 0 && (esc < 0 || esc > end) {
		return b[:end], b[end+1:], true
	}
	start := len(s.scratch)
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			return s.scratch[start:], b[i+1:], true
		case '\\':
			if i+1 == len(b) {
				return nil, nil, false
			}
			i++
			switch b[i] {
			case 'n':
				s.scratch = append(s.scratch, '\n')
			default:
				s.scratch = append(s.scratch, b[i])
			}
		default:
			s.scratch = append(s.scratch, c)
		}
	}
	return nil, nil, false
}

// Stats counts what a scan saw.
type Stats struct {
	// Samples is the number of sample lines: every non-comment line whose
	// name the filter rejected, and every wanted line that parsed.
	Samples int
	// Kept is the number passed to the callback.
	Kept int
	// Malformed is the number of lines that did not parse. Unwanted lines
	// are only checked for a name.
	Malformed int
}

// Scan reads every sample line of body. want is called with each line's
// metric name before anything else is decoded; only lines it accepts are
// parsed further and reach fn. Comment lines, blank lines and malformed lines
// are skipped; malformed ones are counted. A body that is not UTF-8 is
// refused whole.
func Scan(body []byte, want func(name []byte) bool, fn func(*Sample)) (Stats, error) {
	var st Stats
	if !utf8.Valid(body) {
		return st, errors.New("exposition is not valid UTF-8")
	}
	var s Sample
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		line = trimRight(trimLeft(line))
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		n := 0
		for n < len(line) && isNameByte(line[n]) {
			n++
		}
		if n == 0 {
			st.Malformed++
			continue
		}
		name := line[:n]
		st.Samples++
		if !want(name) {
			// Unwanted lines are not decoded at all: not their labels, not
			// their values. That is where a filtered scan saves its time.
			continue
		}
		rest := line[n:]
		var labels []byte
		hasLabels := len(rest) > 0 && rest[0] == '{'
		if hasLabels {
			end, ok := labelsEnd(rest)
			if !ok {
				st.Samples--
				st.Malformed++
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		value, ts, hasTS, ok := valueAndTimestamp(rest)
		if !ok {
			st.Samples--
			st.Malformed++
			continue
		}
		st.Kept++
		s.Name, s.Value, s.Timestamp, s.HasTimestamp, s.labels, s.hasLabels = name, value, ts, hasTS, labels, hasLabels
		s.scratch = s.scratch[:0]
		fn(&s)
	}
	return st, nil
}

// labelsEnd finds the closing brace of a label section that starts at b[0],
// honouring quotes and escapes.
func labelsEnd(b []byte) (int, bool) {
	inQuote := false
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			if inQuote {
				i++
			}
		case '"':
			inQuote = !inQuote
		case '}':
			if !inQuote {
				return i, true
			}
		}
	}
	return 0, false
}

// valueAndTimestamp parses " value [timestamp]" with any amount of blank
// space. A timestamp that does not parse makes the line malformed; a third
// token is also refused.
func valueAndTimestamp(b []byte) (v float64, ts int64, hasTS, ok bool) {
	b = trimLeft(b)
	i := bytes.IndexAny(b, " \t")
	tok := b
	if i >= 0 {
		tok, b = b[:i], trimLeft(b[i:])
	} else {
		b = nil
	}
	if len(tok) == 0 {
		return 0, 0, false, false
	}
	v, ok = parseFloat(tok)
	if !ok {
		return 0, 0, false, false
	}
	b = trimRight(b)
	if len(b) == 0 {
		return v, 0, false, true
	}
	if bytes.ContainsAny(b, " \t") {
		return 0, 0, false, false
	}
	// OpenMetrics timestamps are seconds with a fraction; text ones are ms.
	if n, err := strconv.ParseInt(unsafeString(b), 10, 64); err == nil {
		return v, n, true, true
	}
	if f, err := strconv.ParseFloat(unsafeString(b), 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
		return v, int64(f * 1000), true, true
	}
	return 0, 0, false, false
}

// parseFloat parses a sample value, including Prometheus' spellings of the
// special values.
func parseFloat(b []byte) (float64, bool) {
	switch string(b) {
	case "+Inf", "Inf":
		return math.Inf(1), true
	case "-Inf":
		return math.Inf(-1), true
	case "NaN":
		return math.NaN(), true
	}
	f, err := strconv.ParseFloat(unsafeString(b), 64)
	if err != nil {
		return 0, false
	}
	return f, true
}

// unsafeString views b as a string without copying. Only for arguments of
// calls that do not keep them: the parse errors that would hold the string
// are dropped on the spot.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func isNameByte(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

func isLabelNameByte(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

func trimLeft(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

func trimRight(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Types returns the declared type of every family with a `# TYPE` line,
// keyed by normalized name, wherever the line stands in the body.
func Types(body []byte) map[string]string {
	out := map[string]string{}
	for len(body) > 0 {
		i := bytes.Index(body, []byte("# TYPE "))
		if i < 0 {
			break
		}
		if i > 0 && body[i-1] != '\n' {
			body = body[i+7:]
			continue
		}
		body = body[i+7:]
		end := bytes.IndexByte(body, '\n')
		line := body
		if end >= 0 {
			line = body[:end]
		}
		fields := bytes.Fields(line)
		if len(fields) == 2 {
			out[Normalize(string(fields[0]))] = string(fields[1])
		}
	}
	return out
}

// Normalize maps a metric name to its matching form: ':' becomes '_'.
func Normalize(name string) string {
	if !containsColon(name) {
		return name
	}
	b := []byte(name)
	for i, c := range b {
		if c == ':' {
			b[i] = '_'
		}
	}
	return string(b)
}

func containsColon(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return true
		}
	}
	return false
}

// NameIs reports whether name, normalized, equals want (already normalized).
// It does not allocate.
func NameIs(name []byte, want string) bool {
	if len(name) != len(want) {
		return false
	}
	for i := range name {
		c := name[i]
		if c == ':' {
			c = '_'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}

// NameSet is a set of normalized metric names that answers membership for a
// raw name without allocating.
type NameSet struct {
	index map[string]int
	// lengths marks the name lengths in the set: most lines of a page are
	// rejected on length alone, before any hashing.
	lengths [256]bool
}

// NewNameSet builds a set; each name is normalized. Index returns positions
// in this order.
func NewNameSet(names ...string) *NameSet {
	ns := &NameSet{index: make(map[string]int, len(names))}
	for i, n := range names {
		if _, dup := ns.index[Normalize(n)]; !dup {
			ns.index[Normalize(n)] = i
		}
		if len(n) < len(ns.lengths) {
			ns.lengths[len(n)] = true
		}
	}
	return ns
}

// Index returns the position of name (raw, normalized on the fly) or -1.
func (ns *NameSet) Index(name []byte) int {
	var buf [256]byte
	if len(name) >= len(buf) || !ns.lengths[len(name)] {
		return -1
	}
	n := copy(buf[:], name)
	for i := range n {
		if buf[i] == ':' {
			buf[i] = '_'
		}
	}
	if i, ok := ns.index[string(buf[:n])]; ok {
		return i
	}
	return -1
}

// Has reports membership.
func (ns *NameSet) Has(name []byte) bool { return ns.Index(name) >= 0 }
