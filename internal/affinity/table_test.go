package affinity

import (
	"fmt"
	"testing"
)

func TestTableBindsRefreshesAndExpires(t *testing.T) {
	tb := New(Bounds{TTLMs: 1000, MaxEntries: 10, MaxBytes: 1 << 20})
	if _, o := tb.Lookup("s", 0); o != Missing {
		t.Fatalf("empty table: %v, want Missing", o)
	}
	tb.Bind("s", Binding{"east", "pool"}, 0)
	if b, o := tb.Lookup("s", 900); o != Found || b != (Binding{"east", "pool"}) {
		t.Fatalf("at 900 ms: %v %v, want east/pool found", b, o)
	}
	// The lookup at 900 refreshed the TTL: alive at 1800, gone after 2800.
	if _, o := tb.Lookup("s", 1800); o != Found {
		t.Fatalf("at 1800 ms, 900 after its last use: %v, want Found", o)
	}
	if _, o := tb.Lookup("s", 2800); o != Expired {
		t.Fatalf("at 2800 ms, 1000 after its last use: %v, want Expired", o)
	}
	if _, o := tb.Lookup("s", 2801); o != Missing || tb.Len() != 0 || tb.Bytes() != 0 {
		t.Fatalf("after expiry: %v, len %d, bytes %d; want Missing, 0, 0", o, tb.Len(), tb.Bytes())
	}
}

// TestTableIsBounded: entries and bytes stay under their caps whatever
// clients send, the least recently used going first, each eviction counted.
func TestTableIsBounded(t *testing.T) {
	tb := New(Bounds{TTLMs: 1 << 40, MaxEntries: 100, MaxBytes: 100 * (entryOverhead + 20)})
	evicted := 0
	for i := range 1000 {
		evicted += tb.Bind(fmt.Sprintf("session-%04d", i), Binding{"east", "p"}, int64(i))
		if i == 500 {
			tb.Lookup("session-0450", int64(i)) // used recently: kept past the others of its age
		}
	}
	if tb.Len() > 100 || tb.Bytes() > 100*(entryOverhead+20) {
		t.Errorf("len %d, bytes %d: over the caps", tb.Len(), tb.Bytes())
	}
	if evicted != 1000-tb.Len() {
		t.Errorf("%d evictions counted, %d entries left of 1000", evicted, tb.Len())
	}
	if _, o := tb.Lookup("session-0999", 1000); o != Found {
		t.Errorf("the newest session was evicted")
	}
	if _, o := tb.Lookup("session-0000", 1000); o != Missing {
		t.Errorf("the oldest session survived")
	}
	// Large keys: the byte cap binds before the entry cap.
	big := New(Bounds{TTLMs: 1 << 40, MaxEntries: 1000, MaxBytes: 10 * (entryOverhead + 1024 + 5)})
	for i := range 100 {
		big.Bind(fmt.Sprintf("%01024d", i), Binding{"east", "p"}, 0)
	}
	if big.Len() > 10 || big.Bytes() > 10*(entryOverhead+1024+5) {
		t.Errorf("1 KiB keys: len %d, bytes %d; want at most 10 entries", big.Len(), big.Bytes())
	}
	if n := big.Bind(string(make([]byte, 1<<20)), Binding{"east", "p"}, 0); n != 1 || big.Len() > 10 {
		t.Errorf("a key over the byte cap: %d evicted, len %d; want it refused and counted", n, big.Len())
	}
	if n := big.SetBounds(Bounds{TTLMs: 1, MaxEntries: 3, MaxBytes: 1 << 20}); n < 7 || big.Len() != 3 {
		t.Errorf("a reload to 3 entries: %d evicted, %d left", n, big.Len())
	}
}
