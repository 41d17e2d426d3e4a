package operator

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/grid-inference/grid/internal/clock"
)

// The long poll of GET /v1/site/signals (docs/signals.md, docs/protocol.md
// §2.1): a caller that passes wait and since (a cursor an earlier answer
// gave it) is answered as soon as what it may read changed after that
// cursor, or when the wait ends. The waiting costs the serving goroutine
// only: waits watch a change notifier and one operator-wide bell that rings
// every second, not timers of their own.

// MaxWait is the longest wait a caller may ask for (Limits.MaxWait).
const MaxWait = 60 * time.Second

// notifier tells waiters that something changed: a version that rises on
// every change, and a channel closed at each change. Any goroutine may use
// it.
type notifier struct {
	mu      sync.Mutex
	version uint64
	ch      chan struct{}
}

func newNotifier() *notifier { return &notifier{ch: make(chan struct{})} }

// bump records a change and wakes every waiter.
func (n *notifier) bump() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.version++
	close(n.ch)
	n.ch = make(chan struct{})
}

// state is the current version and the channel the next change closes.
func (n *notifier) state() (uint64, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.version, n.ch
}

// cursor renders a version as it travels.
func cursor(v uint64) string { return strconv.FormatUint(v, 10) }

// waits is the operator's long-poll state. Any goroutine may use it.
type waits struct {
	// site changes with this site's rows (what a peer reads); relay with
	// this site's or any peer's (what the Local caller reads).
	site, relay *notifier
	// bell rings every second while the signals listener serves, so a
	// waiter notices its deadline without a timer of its own.
	bell *notifier
	// stopping is closed when the listener starts to stop: waits end at
	// once and the drain is not held by them.
	stopping chan struct{}
	stopOnce sync.Once

	mu sync.Mutex
	// waiting holds, per caller key, the channel that ends its wait: a
	// second wait of the same caller ends the first.
	waiting map[string]chan struct{}
}

func newWaits() *waits {
	return &waits{site: newNotifier(), relay: newNotifier(), bell: newNotifier(),
		stopping: make(chan struct{}), waiting: map[string]chan struct{}{}}
}

// siteChanged and peersChanged are the stores' change hooks.
func (w *waits) siteChanged()  { w.site.bump(); w.relay.bump() }
func (w *waits) peersChanged() { w.relay.bump() }

// wakeAll ends every wait (a reload: what callers may read changed).
func (w *waits) wakeAll() { w.site.bump(); w.relay.bump() }

// stop ends every wait, now and to come.
func (w *waits) stop() { w.stopOnce.Do(func() { close(w.stopping) }) }

// ring runs the bell every second until ctx ends.
func (w *waits) ring(ctx context.Context, clk clock.Clock) {
	every(ctx, clk, func() time.Duration { return time.Second }, w.bell.bump)
}

// wait blocks until n moves past since, the deadline passes on clk, the
// caller (key) waits again elsewhere, the listener stops, or ctx ends. It
// returns at once when n already moved.
func (w *waits) wait(ctx context.Context, clk clock.Clock, n *notifier, key string, since uint64, deadline time.Time) {
	v, changed := n.state()
	if v != since {
		return
	}
	ended := make(chan struct{})
	w.mu.Lock()
	if prev := w.waiting[key]; prev != nil {
		close(prev) // one wait per caller: the newer one holds
	}
	w.waiting[key] = ended
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		if w.waiting[key] == ended {
			delete(w.waiting, key)
		}
		w.mu.Unlock()
	}()
	for {
		_, bell := w.bell.state()
		select {
		case <-changed:
			return
		case <-ended:
			return
		case <-w.stopping:
			return
		case <-ctx.Done():
			return
		case <-bell:
			if !clk.Now().Before(deadline) {
				return
			}
		}
	}
}
