package gateway

import "net/http"

// Stream tails: a peer's event stream copied at the top of the hop handler.
//
// The hop speaks HTTP/2, whose server keeps a stream open for exactly as
// long as its handler runs, so a stream served for a peer gateway cannot
// be detached as a client's is (detach.go): its handler's goroutine copies
// it to the end. Copied where the answer arrives (relayAnswer, under
// serveAPI, deliver and forward), that goroutine parked 5.5 KiB deep for
// the whole stream, and its stack, grown to 16 KiB by the request's
// routing, stayed at 16 KiB: the runtime halves a parked stack only while
// less than a quarter of it is used. So forward relays the stream's head
// and leaves the rest, the tail, to the hop handler, which copies it once
// the API handler has returned: about 2.5 KiB deep, and the stack halves
// at the next collection (BENCHMARKS.md, a stream served by the peer
// site). What the client sees is the same: the same writes, flushed at
// once, the same terminal event, and an answer cut (the handler aborted)
// where the in-place copy cut it.

// streamTail is the rest of a peer's event stream (a 200 text/event-stream
// answer of unknown length), left by forward on the handler's goroutine
// and copied by the hop handler on the same goroutine after serveAPI has
// returned.
type streamTail struct {
	w    *trackingWriter
	resp *http.Response // its body is the upstream's answer (watchedBody)
	// ans is the attempt's answer, whose failure names an aborted
	// stream's outcome.
	ans *answer
	// finish releases the upstream request's contexts (forward); observe,
	// set by deliver, tells the observed service the stream is over and,
	// when whole, what it took; end, set by serveAPI, counts the request.
	finish  func()
	observe func(whole bool)
	end     func(outcome string)
}

// run copies the stream to its end, then counts it as the handler would
// have had it copied the stream in place; an answer that cannot be copied
// to its end aborts the handler (relayBody), after it is counted.
func (t *streamTail) run() {
	whole := false
	defer func() {
		t.finish()
		t.observe(whole)
		outcome := "routed"
		switch {
		case whole:
		case t.ans.failure != "":
			outcome = "upstream_error"
		default:
			outcome = "client_gone"
		}
		t.end(outcome)
	}()
	// A detached stream's buffer (1 KiB, detach.go), held as long: the
	// events of a stream are a few hundred bytes.
	buf := chunkBuffers.Get().(*[chunkBufSize]byte)
	defer chunkBuffers.Put(buf)
	relayBody(t.w, t.resp, true, buf[:])
	whole = true
}
