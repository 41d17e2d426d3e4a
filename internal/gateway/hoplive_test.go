package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// watched registers one end of a pipe as a watched hop connection and
// returns it with the other end, the peer's.
func watched(t *testing.T, w *hopWatch) (*hopConn, net.Conn) {
	t.Helper()
	mine, peers := net.Pipe()
	t.Cleanup(func() { mine.Close(); peers.Close() })
	c := &hopConn{Conn: mine, watch: w}
	w.mu.Lock()
	w.conns[c] = struct{}{}
	w.mu.Unlock()
	return c, peers
}

func isWatched(w *hopWatch, c *hopConn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.conns[c]
	return ok
}

// TestHopWatchCountsOnlyAwakeSilence: a peer that sends nothing for
// hopSilenceLimit of looks is closed, and a read on its connection fails
// with an error classified connection_lost; a stall of this process (looks
// seconds apart) counts as two looks, so a peer whose answer waits in the
// socket through the stall is not taken for dead; a byte read clears the
// silence.
func TestHopWatchCountsOnlyAwakeSilence(t *testing.T) {
	w := newHopWatch(slog.New(slog.DiscardHandler))
	quiet, _ := watched(t, w)
	talking, peer := watched(t, w)
	go func() {
		for {
			if _, err := peer.Write([]byte{1}); err != nil {
				return
			}
		}
	}()
	read := func() {
		if _, err := talking.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}

	now := time.Unix(1000, 0)
	look := func(d time.Duration) { now = now.Add(d); w.look(now) }
	look(0)
	// 1.3 s awake, then the process stalls for 10 s: 1.5 s of silence.
	for range 13 {
		look(hopWatchEvery)
	}
	look(10 * time.Second)
	if !isWatched(w, quiet) {
		t.Fatal("a 10 s stall of this process was counted as the peer's silence")
	}
	// Awake again: the quiet peer is out once 2.3 s of looks have passed.
	for range 7 {
		read() // the talking peer keeps talking
		look(hopWatchEvery)
	}
	if !isWatched(w, quiet) {
		t.Fatal("closed after 2.2 s of silence")
	}
	read()
	look(hopWatchEvery)
	if isWatched(w, quiet) {
		t.Fatal("a peer silent for 2.3 s is still watched")
	}
	if _, err := quiet.Read(make([]byte, 1)); !errors.Is(err, errHopSilent) || classifyUpstream(err) != upstreamLost {
		t.Errorf("read on the closed connection: %v (%s), want errHopSilent (connection_lost)", err, classifyUpstream(err))
	}
	if !isWatched(w, talking) {
		t.Error("a peer that sent a byte every look was closed")
	}
	// The talking peer goes quiet: its silence starts from its last byte.
	for range 22 {
		look(hopWatchEvery)
	}
	if !isWatched(w, talking) {
		t.Fatal("closed 2.2 s after its last byte")
	}
	look(hopWatchEvery)
	if isWatched(w, talking) {
		t.Error("still watched 2.3 s after its last byte")
	}
	if _, err := io.ReadAll(talking); !errors.Is(err, errHopSilent) {
		t.Errorf("read after the watch closed it: %v", err)
	}
}
