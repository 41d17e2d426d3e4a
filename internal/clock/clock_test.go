package clock

import (
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
