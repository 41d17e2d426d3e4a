package clock

import (
	"context"
	"testing"
	"time"
)

func TestFakeTimerFiresOnlyWhenDue(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	f := NewFake(start)
	tm := f.NewTimer(2 * time.Second)
	f.Advance(time.Second)
	select {
	case <-tm.C():
		t.Fatal("timer fired early")
	default:
	}
	f.Advance(time.Second)
	select {
	case got := <-tm.C():
		if !got.Equal(start.Add(2 * time.Second)) {
			t.Fatalf("fired at %v", got)
		}
	default:
		t.Fatal("timer did not fire when due")
	}
}

func TestFakeTickerDropsMissedTicks(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	tk := f.NewTicker(time.Second)
	f.Advance(5 * time.Second)
	<-tk.C()
	select {
	case <-tk.C():
		t.Fatal("ticker burst after a long advance")
	default:
	}
	f.Advance(time.Second)
	select {
	case <-tk.C():
	default:
		t.Fatal("ticker stopped ticking")
	}
}

func TestFakeSetBackwards(t *testing.T) {
	start := time.Unix(100, 0)
	f := NewFake(start)
	f.Set(start.Add(-time.Hour))
	if got := f.Now(); !got.Equal(start.Add(-time.Hour)) {
		t.Fatalf("Now = %v", got)
	}
}

// TestSleep: Sleep ends when its clock has moved d, and reports false when
// its context ends first.
func TestSleep(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	done := make(chan bool)
	go func() { done <- Sleep(context.Background(), f, time.Second) }()
	for {
		f.Advance(100 * time.Millisecond)
		select {
		case ok := <-done:
			if !ok {
				t.Fatal("Sleep reported a cancel it did not have")
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if Sleep(ctx, f, time.Hour) || Sleep(ctx, f, 0) {
				t.Error("Sleep on an ended context reported true")
			}
			return
		case <-time.After(time.Millisecond):
		}
	}
}
