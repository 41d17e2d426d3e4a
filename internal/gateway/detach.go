package gateway

// Detached streams.
//
// An SSE answer lasts as long as the model generates, and net/http keeps,
// for every such answer, the server connection's goroutine (its stack stays
// at 16 KiB: the handler parks deep in the answer's copy, relayAnswer, and
// the runtime halves a parked stack only below a quarter used), the
// connection's background reader, and its 4 + 4 KiB of buffers. Once an
// upstream has answered 200 with text/event-stream and no length, the
// server copies the answer as any other for limits.detachAfter; at the
// first event after that (detachingBody), the proxy's copy ends, and the
// gateway takes the client's HTTP/1.1 connection from the server (Hijack,
// with the head and the events so far written) and copies the rest, one
// chunk per read, on a goroutine of its own that parks a few frames deep. A
// stream shorter than that is never detached: what detaching saves is
// memory for as long as a stream lasts, and what it costs, once, is the
// hijack and the connection's return to the server. A client that leaves a
// detached stream is noticed when a write to it fails, an event or two
// later. When the stream ends whole, the connection re-enters the server
// through the client listener (rejoinListener), so a keep-alive client
// keeps it. BENCHMARKS.md (memory per concurrent stream, CPU per request)
// has what this saves and costs; docs/gateway.md the rules.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grid-inference/grid/internal/clock"
)

// stalledStreamWrite bounds how long a detached stream waits for a client
// to take one event: a client that reads nothing for this long is cut,
// and its upstream request cancelled, so it cannot hold an engine's slot.
// A variable for tests only.
var stalledStreamWrite = 60 * time.Second

// rejoinKey carries, in the context of a request that came over the
// client listener, the listener its connection may re-enter through.
type rejoinKey struct{}

// detachVia reports the listener through which r's connection may return
// after a detached stream, or nil when r's answer may not be detached:
// only HTTP/1.1 requests that came over the client listener (Guard) and
// keep their connection open.
func detachVia(r *http.Request) *rejoinListener {
	rj, _ := r.Context().Value(rejoinKey{}).(*rejoinListener)
	if rj == nil || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Close {
		return nil
	}
	return rj
}

// detachable reports whether an upstream's answer may be copied on a
// detached stream: a whole SSE stream (200, no length, no trailers).
func detachable(resp *http.Response) bool {
	return resp.StatusCode == http.StatusOK && resp.ContentLength < 0 && len(resp.Trailer) == 0 && len(resp.TransferEncoding) <= 1
}

// detachedStream copies one SSE answer to a hijacked client connection.
// It is built on the handler's goroutine, then owned by the goroutine
// streamSet.start runs it on.
type detachedStream struct {
	conn net.Conn      // the client's
	body io.ReadCloser // the upstream's answer (watchedBody)
	// ctx is the upstream request's; cancel ends it. A read that fails
	// after ctx ended is the client's leaving, not the upstream's failure.
	ctx    context.Context
	cancel context.CancelFunc
	via    *rejoinListener
	// closeAfter: the answer's head said Connection: close (LameDuck);
	// the connection closes after it.
	closeAfter bool
	// early holds what the client sent after its request (pipelining),
	// which the hijack took from the server's reader: the connection
	// gives it back when it re-enters the server.
	early []byte
	// buf is the chunk buffer (chunkBuffers).
	buf *[chunkBufSize]byte
	// observe, set by the proxy, tells the observed service the stream is
	// over, and, when it was whole, what it took; end, set by the handler,
	// counts the request once it is over.
	observe func(whole bool)
	end     func(outcome string)
	// drainedBy is set, as a unix time in ns, by a drain that ran out of
	// time (cutForDrain, any goroutine): the stream ends with the terminal
	// event, written by then or not at all.
	drainedBy atomic.Int64
}

// DrainGrace is how long a stream cut by a drain past its deadline has to
// take its terminal event: a client that takes nothing for that long is
// closed without it. The server a drain ran out of time on waits as long
// before it closes the connections (cmd/grid).
const DrainGrace = time.Second

// detachingBody is a detachable answer's body (detachable) as the proxy
// copies it: once the stream has run for limits.detachAfter, a read that
// brings bytes makes the next one end the proxy's copy, at once and
// without reading (handedOff), so that the handler detaches the stream
// with the body itself (detach). A stream silent past that time is
// detached at its next event. The handler's goroutine only.
type detachingBody struct {
	body io.ReadCloser // the upstream's answer (watchedBody)
	// resp is the answer, whose headers a detached stream need not keep
	// (detach).
	resp *http.Response
	clk  clock.Clock
	// after is when the stream may be detached.
	after time.Time
	// due: the last read brought bytes past after.
	due bool
	// handedOff: the proxy's copy ended for the stream to be detached;
	// the body stays open for it.
	handedOff bool
}

func (b *detachingBody) Read(p []byte) (int, error) {
	if b.due {
		b.handedOff = true
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if n > 0 && err == nil && !b.clk.Now().Before(b.after) {
		b.due = true
	}
	return n, err
}

// Close closes the answer, unless it goes on on a detached stream.
func (b *detachingBody) Close() error {
	if b.handedOff {
		return nil
	}
	return b.body.Close()
}

// detach takes w's connection from the server, once the proxy has written
// the answer's head and its events so far through w and handed the body
// off, and returns the stream that copies the rest (counted in set as
// detaching: the caller must start it); nil, with w untouched, when the
// server will not give the connection up.
func (b *detachingBody) detach(w http.ResponseWriter, set *streamSet, via *rejoinListener, ctx context.Context, cancel context.CancelFunc) *detachedStream {
	set.beginDetach()
	rc := http.NewResponseController(w)
	// The proxy flushed what it wrote; flushing again writes nothing, and
	// makes sure the server's buffer, dropped by the hijack, is empty.
	rc.Flush()
	conn, brw, err := rc.Hijack()
	if err != nil {
		set.abandon()
		return nil
	}
	s := &detachedStream{conn: conn, body: b.body, ctx: ctx, cancel: cancel, via: via,
		closeAfter: w.Header().Get("Connection") == "close", buf: chunkBuffers.Get().(*[chunkBufSize]byte)}
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ := brw.Reader.Peek(n)
		s.early = bytes.Clone(early)
	}
	// The body keeps its answer (for trailers) as long as the stream
	// lasts; the headers are written, and the transport does not read
	// them once it has handed the answer over.
	b.resp.Header = nil
	return s
}

// The chunk buffer of a detached stream, 1 KiB held for as long as the
// stream lasts: up to 1,012 bytes of the answer per chunk (an SSE event
// is a few hundred bytes; a larger one goes out in several chunks), with
// room for the chunk's size line before the data and its CRLF after, so
// each goes out in one write.
const (
	chunkBufSize  = 1 << 10
	chunkHeadRoom = 10 // up to 8 hex digits and CRLF
	chunkData     = chunkBufSize - chunkHeadRoom - 2
)

var chunkBuffers = sync.Pool{New: func() any { return new([chunkBufSize]byte) }}

// run copies the stream until the upstream ends it, fails, or the client
// leaves; then it gives the connection back to the server if the stream
// ended whole, else closes it (a cut stream ends without the last chunk,
// as net/http ends one, so the client sees it cut; one a drain cut ends
// with the terminal event and the last chunk first), and counts the
// request.
func (s *detachedStream) run() {
	outcome, whole := s.copy()
	chunkBuffers.Put(s.buf)
	if !whole {
		s.cancel()
	}
	// A whole stream's request context is not cancelled: the upstream
	// connection goes back to its pool on the body's end, and cancelling
	// races that. The context holds no goroutine or timer.
	if !whole && s.drainedBy.Load() != 0 {
		s.interrupt()
	}
	s.body.Close()
	s.observe(whole)
	if whole {
		s.conn.SetWriteDeadline(time.Now().Add(stalledStreamWrite))
		_, err := io.WriteString(s.conn, "0\r\n\r\n")
		// The connection goes back to the server unless the answer's head
		// said it closes, even while the gateway drains: the client,
		// promised keep-alive, may be writing its next request on it
		// already, and a drain answers it, closing the connection
		// (QuietClients). Once the server has shut down, rejoin refuses.
		if err == nil && !s.closeAfter {
			s.conn.SetWriteDeadline(time.Time{})
			if s.via.rejoin(s.conn, s.early) {
				s.end(outcome)
				return
			}
		}
	}
	s.conn.Close()
	s.end(outcome)
}

// copy moves the answer's bytes to the client, each read as one chunk.
// whole: the upstream ended the answer and the client took all of it.
func (s *detachedStream) copy() (outcome string, whole bool) {
	buf := s.buf
	for {
		n, err := s.body.Read(buf[chunkHeadRoom : chunkHeadRoom+chunkData])
		if n > 0 {
			start := chunkHeadRoom - 2
			buf[start], buf[start+1] = '\r', '\n'
			size := strconv.AppendUint(buf[:0:chunkHeadRoom], uint64(n), 16)
			start -= len(size)
			copy(buf[start:], size)
			buf[chunkHeadRoom+n], buf[chunkHeadRoom+n+1] = '\r', '\n'
			s.writeDeadline()
			if _, werr := s.conn.Write(buf[start : chunkHeadRoom+n+2]); werr != nil {
				return "routed", false // the client left or stalled: as net/http counts it
			}
		}
		switch {
		case err == io.EOF:
			return "routed", true
		case err != nil && s.ctx.Err() != nil:
			return "routed", false // the client left, or the stream was cut
		case err != nil:
			return "upstream_error", false // watchedBody told passive health
		}
	}
}

// writeDeadline bounds the next write to the client: stalledStreamWrite,
// or the drain's grace when that is sooner. It reads drainedBy after
// setting the deadline, so that a drain setting both meanwhile is not
// undone.
func (s *detachedStream) writeDeadline() {
	d := time.Now().Add(stalledStreamWrite)
	s.conn.SetWriteDeadline(d)
	if by := s.drainedBy.Load(); by != 0 && by < d.UnixNano() {
		s.conn.SetWriteDeadline(time.Unix(0, by))
	}
}

// interrupt writes the terminal event of a stream a drain cut, then the
// answer's last chunk (the client reads an error, then a well-framed end),
// within the drain's grace.
func (s *detachedStream) interrupt() {
	wb, ok := s.body.(*watchedBody)
	if !ok {
		return
	}
	ev := wb.interrupt(streamShutdown)
	if ev == nil {
		return
	}
	s.conn.SetWriteDeadline(time.Unix(0, s.drainedBy.Load()))
	fmt.Fprintf(s.conn, "%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
}

// cut ends the stream from outside (Close): the client's connection
// closes and the upstream request is cancelled, so run's read or write
// returns.
func (s *detachedStream) cut() {
	s.cancel()
	s.conn.Close()
}

// cutForDrain ends the stream for a drain that ran out of time: the
// upstream request is cancelled, so run's read returns, and run writes
// the terminal event within DrainGrace; a write to a stalled client
// fails by then.
func (s *detachedStream) cutForDrain() {
	by := time.Now().Add(DrainGrace)
	s.drainedBy.Store(by.UnixNano())
	s.conn.SetWriteDeadline(by)
	s.cancel()
}

// streamSet owns the detached streams: it starts each on its goroutine,
// and drains or cuts them at shutdown. A stream is counted from just
// before its connection leaves the server (detaching), so that a drain
// that follows the server's own never misses one between the two.
type streamSet struct {
	wg        sync.WaitGroup
	changed   chan struct{} // a token when a stream starts or ends, for drain (capacity 1)
	detaching atomic.Int32  // hijacks begun whose streams have not started
	// waiting counts the detachable streams the server copies still
	// (waitToDetach), up to maxWaiting (maxWaitingToDetach; tests set
	// it before the set is used).
	waiting    atomic.Int32
	maxWaiting int32

	mu   sync.Mutex
	live map[*detachedStream]struct{} // under mu
	cut  bool                         // under mu: cutAndWait ran; streams starting after it are cut at once
	// drained, under mu: that cut was a drain's, which ends streams with
	// the terminal event.
	drained bool
}

func newStreamSet() *streamSet {
	return &streamSet{changed: make(chan struct{}, 1), live: map[*detachedStream]struct{}{}, maxWaiting: maxWaitingToDetach}
}

func (set *streamSet) signal() {
	select {
	case set.changed <- struct{}{}:
	default:
	}
}

// detaching counts a hijack about to begin; undo it with abandon if the
// hijack fails, else start the stream.
func (set *streamSet) beginDetach() { set.detaching.Add(1) }

func (set *streamSet) abandon() {
	set.detaching.Add(-1)
	set.signal()
}

// start runs s on a goroutine of its own; end is called when it is over.
func (set *streamSet) start(s *detachedStream, end func(outcome string)) {
	s.end = func(outcome string) {
		end(outcome)
		set.mu.Lock()
		delete(set.live, s)
		set.mu.Unlock()
		set.signal()
	}
	set.mu.Lock()
	if set.cut {
		// After cutAndWait: end the stream here, cut, so that no
		// goroutine is added to a group already waited for.
		drained := set.drained
		set.mu.Unlock()
		set.detaching.Add(-1)
		if drained {
			s.cutForDrain()
		} else {
			s.cut()
		}
		s.run()
		return
	}
	set.live[s] = struct{}{}
	set.wg.Add(1)
	set.mu.Unlock()
	set.detaching.Add(-1)
	go func() {
		defer set.wg.Done()
		s.run()
	}()
	set.signal()
}

// maxWaitingToDetach bounds the detachable streams the server copies at
// once: past it, a new stream is detached at its first event, whatever
// limits.detachAfter says. A flash crowd of new streams then holds the
// memory of detached ones, as it would if every stream were detached at
// once, and the server's copies, at about twice that, are at most this
// many (4 MiB or so).
const maxWaitingToDetach = 128

// waitToDetach counts a detachable stream the server copies, until
// waited, and returns how long it may wait to be detached: after, or
// nothing when maxWaitingToDetach wait already.
func (set *streamSet) waitToDetach(after time.Duration) time.Duration {
	if set.waiting.Add(1) > set.maxWaiting {
		return 0
	}
	return after
}

// waited ends waitToDetach's count: the stream ended or was detached.
func (set *streamSet) waited() { set.waiting.Add(-1) }

// busy reports whether a stream is being copied or about to be.
func (set *streamSet) busy() bool { return set.Len() > 0 || set.detaching.Load() > 0 }

// Len is the number of streams being copied now.
func (set *streamSet) Len() int {
	set.mu.Lock()
	defer set.mu.Unlock()
	return len(set.live)
}

// drain waits until every stream has ended, or ctx is done; then it cuts
// those left and waits for their goroutines. It returns ctx's error when
// it had to cut.
func (set *streamSet) drain(ctx context.Context) error {
	for set.busy() {
		select {
		case <-set.changed:
		case <-ctx.Done():
			set.cutAndWait(true)
			return ctx.Err()
		}
	}
	set.wg.Wait()
	return nil
}

// cutAndWait cuts every stream, and every one that starts after it, and
// waits for their goroutines. A drain's cut (drained) ends each stream
// with the terminal event; Close's closes the connections at once.
func (set *streamSet) cutAndWait(drained bool) {
	set.mu.Lock()
	set.cut, set.drained = true, drained
	for s := range set.live {
		if drained {
			s.cutForDrain()
		} else {
			s.cut()
		}
	}
	set.mu.Unlock()
	set.wg.Wait()
}

// rejoinListener is the client listener with a way back in: Accept yields
// the connections detached streams are done with, as well as new ones, so
// the server reads a keep-alive client's next request as it would have.
// Its one accepting goroutine, started by the first Accept, ends when the
// listener closes.
type rejoinListener struct {
	net.Listener
	idle     time.Duration // limits.clientIdleTimeout, read at start
	back     chan net.Conn // connections to serve again
	accepted chan acceptResult
	once     sync.Once
	closed   chan struct{}

	mu          sync.Mutex
	isClosed    bool // under mu: nothing is sent on back after it is set
	innerClosed bool // under mu: the listener under this one is closed
}

type acceptResult struct {
	conn net.Conn
	err  error
}

// rejoinQueue bounds the connections waiting to re-enter; one that finds
// it full is closed (its client reconnects).
const rejoinQueue = 256

func newRejoinListener(ln net.Listener, idle time.Duration) *rejoinListener {
	return &rejoinListener{Listener: ln, idle: idle, back: make(chan net.Conn, rejoinQueue), accepted: make(chan acceptResult), closed: make(chan struct{})}
}

// Accept returns the next connection to serve: one coming back, or a new one.
func (l *rejoinListener) Accept() (net.Conn, error) {
	l.once.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.accepted:
		return a.conn, a.err
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *rejoinListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if errors.Is(err, net.ErrClosed) {
			// No new connection comes (stopAccepting, or Close): Accept
			// goes on yielding the ones coming back until Close.
			return
		}
		select {
		case l.accepted <- acceptResult{c, err}:
		case <-l.closed:
			if c != nil {
				c.Close()
			}
			return
		}
	}
}

// stopAccepting closes the listener under this one: no new connection
// comes, while the ones detached streams hand back are still served, and
// a connection already accepted is served rather than closed (its client
// may have written a request on it). Any goroutine.
func (l *rejoinListener) stopAccepting() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.innerClosed {
		l.innerClosed = true
		l.Listener.Close()
	}
}

// rejoin queues c to be served again, its reads giving early first (the
// bytes the client sent after its last request, which a hijack took);
// false when the listener is closed or its queue full, and c is the
// caller's to close.
func (l *rejoinListener) rejoin(c net.Conn, early []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isClosed {
		return false
	}
	rc, again := c.(*rejoinedConn)
	if !again {
		rc = &rejoinedConn{Conn: c, idle: l.idle}
	}
	rc.early = early
	// A request already begun has its header's time, not the idle wait.
	rc.waiting.Store(len(early) == 0)
	select {
	case l.back <- rc:
		return true
	default:
		return false
	}
}

// rejoinedConn is a connection back from a detached stream. The server
// takes it for a new one, and would give its client the header read
// timeout to send a request; but it is a kept-alive connection between
// requests, so until the next request's first byte its reads wait
// limits.clientIdleTimeout, as the server's idle wait does, and the
// header's own time runs from that byte. The server's goroutines touch
// it; waiting and header are atomic, early is read by the one that reads
// the connection.
type rejoinedConn struct {
	net.Conn
	idle    time.Duration
	waiting atomic.Bool  // no byte read since the connection came back
	header  atomic.Int64 // the header read time the server asked for
	// early is what the client sent before the connection came back,
	// read before the connection's own bytes.
	early []byte
}

func (c *rejoinedConn) SetReadDeadline(t time.Time) error {
	if wait := time.Until(t); c.waiting.Load() && wait > 0 {
		c.header.Store(int64(wait))
		return c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *rejoinedConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

func (c *rejoinedConn) Read(p []byte) (int, error) {
	if len(c.early) > 0 {
		n := copy(p, c.early)
		c.early = c.early[n:]
		return n, nil
	}
	n, err := c.Conn.Read(p)
	if n > 0 && c.waiting.CompareAndSwap(true, false) {
		if h := time.Duration(c.header.Load()); h > 0 {
			c.Conn.SetReadDeadline(time.Now().Add(h))
		}
	}
	return n, err
}

// NetConn is the connection under it (connlimit.Listener.SetIdle).
func (c *rejoinedConn) NetConn() net.Conn { return c.Conn }

// Close closes the listener and the connections waiting to re-enter it.
func (l *rejoinListener) Close() error {
	l.mu.Lock()
	if l.isClosed {
		l.mu.Unlock()
		return nil
	}
	l.isClosed = true
	innerClosed := l.innerClosed
	l.innerClosed = true
	l.mu.Unlock()
	close(l.closed)
	for {
		select {
		case c := <-l.back:
			c.Close()
		default:
			if innerClosed {
				return nil
			}
			return l.Listener.Close()
		}
	}
}
