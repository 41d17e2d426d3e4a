package h1client

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strings"
)

// The answer head of an inference engine is one of a few plain shapes:
// HTTP/1.1, a status of 200-599, a few header fields on a line each,
// framed by a Content-Length or chunked, all of it in the first read.
// parseHead reads that shape with four allocations (the answer, its
// header map, one string holding every name and value, one array of value
// slices) where net/http.ReadResponse takes about ten (a string per value,
// a textproto reader's state, a limited reader and a body); an answer of
// any other shape, or one that net/http would refuse or read differently,
// is left to net/http.ReadResponse, which reads it from the same bytes.
// FuzzParseHead holds the two to the same answer wherever parseHead takes
// one.

// maxFastFields is the most header fields parseHead takes; an answer with
// more is read by net/http.
const maxFastFields = 32

// chunkedEncoding is the TransferEncoding of every chunked answer
// parseHead reads; callers read it and never write it.
var chunkedEncoding = []string{"chunked"}

// field is one header line's name and value, and where its line ends
// (past its CRLF): offsets into the head.
type field struct{ name, nameEnd, value, valueEnd, lineEnd int }

// parseHead reads an answer head of the plain shape off br and returns the
// answer with its body framed on br, or ok false with nothing read.
func parseHead(br *bufio.Reader, req *http.Request) (resp *http.Response, ok bool) {
	if req.Method == http.MethodHead {
		return nil, false // its Content-Length frames no body
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false // not all in the first read
	}
	head := buf[:end+2] // every line with its CRLF
	// The status line: HTTP/1.1, a space, three digits, then the end or a
	// space and a reason.
	line := bytes.IndexByte(head, '\n')
	if line < 1 || head[line-1] != '\r' {
		return nil, false
	}
	status := head[:line-1]
	if len(status) < 12 || string(status[:9]) != "HTTP/1.1 " || len(status) > 12 && status[12] != ' ' {
		return nil, false
	}
	code := 0
	for _, c := range status[9:12] {
		if c < '0' || c > '9' {
			return nil, false
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil, false // an interim answer, one with no body, or an odd one
	}
	for _, c := range status[12:] {
		if !validValueByte(c) {
			return nil, false
		}
	}
	// The fields: a token, a colon, a value of visible bytes, spaces and
	// tabs, each line ended by CRLF; no folded line, no bare CR or LF.
	var fields [maxFastFields]field
	n := 0
	for at := line + 1; at < len(head); {
		eol := at + bytes.IndexByte(head[at:], '\n')
		if n == maxFastFields || head[eol-1] != '\r' {
			return nil, false
		}
		colon := at
		for colon < eol-1 && validNameByte(head[colon]) {
			colon++
		}
		if colon == at || head[colon] != ':' {
			return nil, false // an empty or invalid name, or a folded line
		}
		v, vEnd := colon+1, eol-1
		for v < vEnd && (head[v] == ' ' || head[v] == '\t') {
			v++
		}
		for vEnd > v && (head[vEnd-1] == ' ' || head[vEnd-1] == '\t') {
			vEnd--
		}
		for _, c := range head[v:vEnd] {
			if !validValueByte(c) {
				return nil, false
			}
		}
		fields[n] = field{at, colon, v, vEnd, eol + 1}
		n++
		at = eol + 1
	}
	// One string for the head, names in canonical form.
	var sb strings.Builder
	sb.Grow(len(head))
	sb.Write(head[:line+1])
	for _, f := range fields[:n] {
		upper := true
		for _, c := range head[f.name:f.nameEnd] {
			if upper && 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			} else if !upper && 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			sb.WriteByte(c)
			upper = c == '-'
		}
		sb.Write(head[f.nameEnd:f.lineEnd])
	}
	s := sb.String()
	h := make(http.Header, n)
	values := make([]string, n)
	for i, f := range fields[:n] {
		name, value := s[f.name:f.nameEnd], s[f.value:f.valueEnd]
		if vv, seen := h[name]; seen {
			h[name] = append(vv, value)
			continue
		}
		values[i] = value
		h[name] = values[i : i+1 : i+1]
	}
	resp = &http.Response{
		Status: s[9 : line-1], StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Request: req,
	}
	if !frame(resp) {
		return nil, false
	}
	br.Discard(end + 4)
	return resp, true
}

// frame sets how resp's body is framed, as net/http would, or reports
// false for a framing left to net/http: none (read to the connection's
// end), a transfer coding other than chunked alone, a Content-Length
// beside one, lengths repeated, trailers declared, a Connection field
// other than close or keep-alive, or a Pragma (net/http adds a
// Cache-Control for it).
func frame(resp *http.Response) bool {
	h := resp.Header
	if h["Trailer"] != nil || h["Pragma"] != nil {
		return false
	}
	switch conn := h["Connection"]; {
	case conn == nil:
	case len(conn) == 1 && strings.EqualFold(conn[0], "keep-alive"):
	case len(conn) == 1 && strings.EqualFold(conn[0], "close"):
		resp.Close = true
		delete(h, "Connection") // as net/http does
	default:
		return false
	}
	te, cl := h["Transfer-Encoding"], h["Content-Length"]
	switch {
	case te != nil:
		if cl != nil || len(te) != 1 || !strings.EqualFold(te[0], "chunked") {
			return false
		}
		delete(h, "Transfer-Encoding")
		resp.TransferEncoding = chunkedEncoding
		resp.ContentLength = -1
	case len(cl) == 1:
		length, ok := parseLength(cl[0])
		if !ok {
			return false
		}
		resp.ContentLength = length
	default:
		return false
	}
	return true
}

// parseLength reads a Content-Length of 1 to 18 digits.
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// framedBody reads an answer's body off its connection as parseHead framed
// it: Content-Length bytes, or chunks and then the trailer section, whose
// fields go to the answer's Trailer as net/http puts them. One goroutine
// reads at a time.
type framedBody struct {
	br     *bufio.Reader
	resp   *http.Response
	remain int64     // bytes left of a Content-Length body
	chunks io.Reader // a chunked body's decoder; nil for Content-Length
	err    error     // once the body has ended, how
}

func (f *framedBody) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if f.chunks != nil {
		n, err := f.chunks.Read(p)
		if err == io.EOF {
			err = f.readTrailer()
		}
		f.err = err
		return n, err
	}
	if f.remain == 0 {
		f.err = io.EOF
		return 0, io.EOF
	}
	if int64(len(p)) > f.remain {
		p = p[:f.remain]
	}
	n, err := f.br.Read(p)
	f.remain -= int64(n)
	switch {
	case f.remain == 0:
		err = nil // the next read says EOF, as net/http's body does
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	}
	f.err = err
	return n, err
}

func (f *framedBody) Close() error { return nil }

// readTrailer reads the trailer section after the last chunk: most often
// just its CRLF.
func (f *framedBody) readTrailer() error {
	if b, _ := f.br.Peek(2); string(b) == "\r\n" {
		f.br.Discard(2)
		return io.EOF
	}
	if !trailerEndBuffered(f.br) {
		return errors.New("h1client: a trailer section longer than the read buffer")
	}
	hdr, err := textproto.NewReader(f.br).ReadMIMEHeader()
	if err != nil {
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	if f.resp.Trailer == nil {
		f.resp.Trailer = http.Header{}
	}
	for k, vv := range hdr {
		f.resp.Trailer[k] = vv
	}
	return io.EOF
}

// trailerEndBuffered reports whether the trailer section's end (an empty
// line) is within what br can buffer, so reading it is bounded (net/http
// asks the same).
func trailerEndBuffered(br *bufio.Reader) bool {
	for size := 4; ; size++ {
		b, err := br.Peek(size)
		if bytes.HasSuffix(b, []byte("\r\n\r\n")) {
			return true
		}
		if err != nil {
			return false
		}
	}
}
