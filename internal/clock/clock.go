// Package clock abstracts time so that rules which depend on it (readiness
// windows, ages, fences, snapshots) can be tested without sleeping.
//
// Production code takes a Clock and uses Real; tests use Fake and advance it
// explicitly.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock is the source of time for every time-dependent rule.
type Clock interface {
	// Now returns the current time. Real clocks carry a monotonic reading, so
	// Sub between two Now values is immune to wall-clock steps.
	Now() time.Time
	// Monotonic is the time elapsed since an arbitrary origin on a clock
	// that steps of the wall clock never move: what rules that must be
	// immune to those steps measure elapsed time by.
	Monotonic() time.Duration
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that fires every d. Like time.Ticker it drops
	// ticks for a slow receiver rather than bursting.
	NewTicker(d time.Duration) Ticker
}

// Timer is the subset of *time.Timer that callers use.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is the subset of *time.Ticker that callers use.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real is the wall and monotonic clock of the process.
type Real struct{}

// Now implements Clock.
func (Real) Now() time.Time { return time.Now() }

// processStart carries the monotonic reading Real.Monotonic counts from.
var processStart = time.Now()

// Monotonic implements Clock: time.Since reads the monotonic clock.
func (Real) Monotonic() time.Duration { return time.Since(processStart) }

// NewTimer implements Clock.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// NewTicker implements Clock.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }

// Fake is a manually advanced clock for tests. Its zero value is not usable;
// build one with NewFake.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	mono    time.Duration // advanced by Advance only
	waiters []*fakeWaiter
}

type fakeWaiter struct {
	at     time.Time
	period time.Duration // 0 for a timer
	ch     chan time.Time
	active bool
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now implements Clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Monotonic implements Clock: it moves with Advance, never with a wall step.
func (f *Fake) Monotonic() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mono
}

// StepWall moves the wall reading by d, forwards or back, as an NTP step or
// an operator's date command does: no time passes, so the monotonic reading
// stays and no timer fires.
func (f *Fake) StepWall(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// Advance moves the clock forward by d and fires every timer and ticker that
// falls due, in time order. A ticker that falls due several times fires once,
// as a real ticker does for a slow reader.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.mono += d
	for _, w := range f.waiters {
		if !w.active || w.at.After(f.now) {
			continue
		}
		select {
		case w.ch <- f.now:
		default:
		}
		if w.period == 0 {
			w.active = false
			continue
		}
		for !w.at.After(f.now) {
			w.at = w.at.Add(w.period)
		}
	}
}

// Set moves the clock to t. Forwards it is Advance; backwards it is a wall
// step (StepWall): no timer fires and the monotonic reading stays.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	back := t.Before(f.now)
	d := t.Sub(f.now)
	if back {
		f.now = t
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	f.Advance(d)
}

// Waiters is how many timers and tickers are active: a test waits for the
// goroutines it started to be waiting on the clock before advancing it.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.waiters {
		if w.active {
			n++
		}
	}
	return n
}

// NewTimer implements Clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	return &fakeTimer{f: f, w: f.add(d, 0)}
}

// NewTicker implements Clock.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive ticker period")
	}
	return &fakeTicker{f: f, w: f.add(d, d)}
}

func (f *Fake) add(d, period time.Duration) *fakeWaiter {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{at: f.now.Add(d), period: period, ch: make(chan time.Time, 1), active: true}
	f.waiters = append(f.waiters, w)
	return w
}

type fakeTimer struct {
	f *Fake
	w *fakeWaiter
}

func (t *fakeTimer) C() <-chan time.Time { return t.w.ch }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.w.active
	t.w.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.w.active
	t.w.active = true
	t.w.at = t.f.now.Add(d)
	return was
}

type fakeTicker struct {
	f *Fake
	w *fakeWaiter
}

func (t *fakeTicker) C() <-chan time.Time { return t.w.ch }

func (t *fakeTicker) Stop() {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.w.active = false
}

func (t *fakeTicker) Reset(d time.Duration) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.w.active = true
	t.w.period = d
	t.w.at = t.f.now.Add(d)
}

// Sleep waits d on c; it reports false when ctx ended first. A d of zero
// or less returns at once, reporting whether ctx is still live.
func Sleep(ctx context.Context, c Clock, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
