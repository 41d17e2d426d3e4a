package operator

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/signals"
)

// heapWatch samples the live heap until stopped and reports the peak.
type heapWatch struct {
	peak atomic.Uint64
	stop chan struct{}
	done sync.WaitGroup
}

func watchHeap() *heapWatch {
	h := &heapWatch{stop: make(chan struct{})}
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > h.peak.Load() {
				h.peak.Store(ms.HeapAlloc)
			}
			select {
			case <-h.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return h
}

func (h *heapWatch) end() uint64 {
	close(h.stop)
	h.done.Wait()
	return h.peak.Load()
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// hostileBodyBound is the most a hostile peer may add to the heap, at the
// peak of a poll and retained after: the 1 MiB read cap, the parse of it,
// and the store's caps, with room for the race detector's overhead.
const hostileBodyBound = 32 << 20

// TestHostilePeerBodiesStayBounded: a peer that answers without end, with
// millions of series, with one enormous label value, or with as many
// distinct providers and series as fit under the cap, costs a bounded
// amount of memory, and the operator keeps what it holds of the other peer.
func TestHostilePeerBodiesStayBounded(t *testing.T) {
	dir := pki(t, "east", "west", "south")
	hostile := startFakePeer(t, dir, "south")
	good := startFakePeer(t, dir, "west")
	now := time.Now().UnixMilli()
	good.serve(time.Now(), batch("west", "a", now-1000, 1, now))
	east := startSite(t, dir, "east", t.TempDir(), "", nil, "south=https://"+hostile.addr, "west=https://"+good.addr)

	line := func(i int) string {
		return fmt.Sprintf("grid_provider_ready{grid_provider=\"p%d\",grid_site=\"south\"} 1 %d\n", i, now)
	}
	bodies := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
	}{
		{"endless lines", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
			for i := 0; r.Context().Err() == nil; i++ {
				if _, err := io.WriteString(w, line(i)); err != nil {
					return
				}
			}
		}},
		{"five million series", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
			for i := range 5_000_000 {
				if _, err := io.WriteString(w, line(i)); err != nil {
					return
				}
			}
		}},
		{"a 64 MiB label value", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
			io.WriteString(w, `grid_provider_ready{grid_provider="p",grid_site="south",x="`)
			chunk := strings.Repeat("v", 64<<10)
			for range 1024 {
				if _, err := io.WriteString(w, chunk); err != nil {
					return
				}
			}
			fmt.Fprintf(w, "\"} 1 %d\n", now)
		}},
		{"distinct providers and names up to the cap", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
			var b strings.Builder
			for i := 0; b.Len() < signals.MaxAnswerBytes-256; i++ {
				fmt.Fprintf(&b, "grid_provider_ready{grid_provider=\"p%d\",grid_site=\"south\",pad=\"%d\"} 1 %d\n", i%5000, i, now)
			}
			io.WriteString(w, b.String())
		}},
	}
	base := liveHeap()
	for _, body := range bodies {
		t.Run(body.name, func(t *testing.T) {
			hostile.set(body.answer)
			w := watchHeap()
			for range 3 {
				east.op.PollPeers(context.Background())
			}
			peak := w.end()
			retained := liveHeap()
			t.Logf("peak heap +%.1f MiB, retained +%.1f MiB", float64(peak-min(peak, base))/(1<<20), float64(retained-min(retained, base))/(1<<20))
			if peak > base+hostileBodyBound || retained > base+hostileBodyBound {
				t.Errorf("heap grew past the bound: peak %d, retained %d, base %d", peak, retained, base)
			}
			if entry(east.op, "west/a") == nil {
				t.Error("the good peer's rows were lost")
			}
			n := 0
			for _, e := range east.op.PeerStore().Current(time.Now()) {
				if strings.HasPrefix(e.Target, "south/") {
					n++
				}
			}
			if n > 64 {
				t.Errorf("%d providers kept for one peer, over the 64 cap", n)
			}
		})
	}
}
