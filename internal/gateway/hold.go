package gateway

import (
	"context"
	"sync"
	"time"
)

// holdRoom holds a client's request while every site of its model is full
// by this gateway's own count (availability.holdWhenFull, docs/gateway.md,
// holding while the grid is full): sent at once, it would wait in the
// queue of the site it was sent to, behind that site's backlog alone,
// however soon another site frees a slot; held, it goes to the first site
// that has room. Each model's requests wait in one line, first come first
// served, and only the first looks for room: when one ahead of it leaves,
// and every holdLook while it leads. A request held for holdWhenFull is
// sent as it would have been without the hold.
//
// Any goroutine may call it; its lines are guarded by mu.
type holdRoom struct {
	mu    sync.Mutex
	lines map[string][]*holder // by model, first come first
}

// holder is one held request's place in its model's line.
type holder struct {
	model string
	// lead is signalled once the holder leads its line; buffered, so
	// the signal waits for it.
	lead chan struct{}
}

// holdLook is how often the first of a line looks for room. A site's
// room shows as this gateway's requests end (its own count) or as a
// reading arrives; both are looked for at this pace rather than
// signalled, so the request path's ends stay as they are, at a cost of a
// Snapshot.Full a look while a line is held.
const holdLook = 10 * time.Millisecond

// join puts a request for model at the end of its line.
func (r *holdRoom) join(model string) *holder {
	h := &holder{model: model, lead: make(chan struct{}, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lines == nil {
		r.lines = map[string][]*holder{}
	}
	line := r.lines[model]
	if len(line) == 0 {
		h.lead <- struct{}{}
	}
	r.lines[model] = append(line, h)
	return h
}

// leave takes h out of its line; when h led, the next one leads. Leaving
// twice is leaving once.
func (r *holdRoom) leave(h *holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	line := r.lines[h.model]
	for k, o := range line {
		if o != h {
			continue
		}
		line = append(line[:k], line[k+1:]...)
		if len(line) == 0 {
			delete(r.lines, h.model)
			return
		}
		r.lines[h.model] = line
		if k == 0 {
			line[0].lead <- struct{}{}
		}
		return
	}
}

// How a hold ended, the label of grid_gateway_holds_total.
type holdEnd string

const (
	holdRoomFound holdEnd = "room"    // a site had room
	holdTimedOut  holdEnd = "timeout" // held for holdWhenFull: sent as it was
	holdGone      holdEnd = "gone"    // the client went away
	holdDraining  holdEnd = "draining"
)

// hold holds the client's request x while every site of its model is
// full (holdRoom) and holdWhenFull is set. It returns the holder x keeps
// until its first attempt has begun (x.unhold), so the next in line
// counts it before it looks; nil when it was not held. gone is true when
// the client went away while held.
func (x *exchange) hold(ctx context.Context) (h *holder, gone bool) {
	g := x.g
	limit := g.cfg.Load().Availability.HoldWhenFull.D()
	if x.peer != nil || limit <= 0 || g.closingConns.Load() || !g.view(nil).Full(x.model, g.timeline.NowMs()) {
		return nil, false
	}
	h = g.holds.join(x.model)
	g.m.held.Inc()
	defer g.m.held.Dec()
	deadline := g.clk.NewTimer(limit)
	defer deadline.Stop()
	end := func(e holdEnd) { g.m.holds.WithLabelValues(string(e)).Inc() }
	// Until h leads, it only waits: leads is its signal and looks is nil,
	// a channel that never fires. Once it leads, it looks for room at
	// once and then every holdLook.
	leads := h.lead
	var looks <-chan time.Time
	for {
		if leads == nil {
			switch {
			case g.closingConns.Load():
				end(holdDraining)
				return h, false
			case !g.view(nil).Full(x.model, g.timeline.NowMs()):
				end(holdRoomFound)
				return h, false
			}
		}
		select {
		case <-leads:
			leads = nil
			look := g.clk.NewTicker(holdLook)
			defer look.Stop()
			looks = look.C()
		case <-looks:
		case <-deadline.C():
			end(holdTimedOut)
			return h, false
		case <-ctx.Done():
			g.holds.leave(h)
			end(holdGone)
			return nil, true
		}
	}
}

// unhold lets the next request in x's line lead, once x's first attempt
// has begun (or x ends without one); nothing when x was not held.
func (x *exchange) unhold() {
	if x.holder != nil {
		x.g.holds.leave(x.holder)
		x.holder = nil
	}
}
