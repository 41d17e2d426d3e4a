package gateway

import (
	"bytes"
	"io"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// bodyBudget bounds the request bodies held in memory across every
// connection: a body is read only into capacity reserved from it, and the
// reservation is held until nothing holds the body (heldBody). Any
// goroutine may reserve and release.
type bodyBudget struct {
	limit atomic.Int64
	used  atomic.Int64
}

// newBodyBudget is a budget of limit bytes, or the default for 0.
func newBodyBudget(limit int64) *bodyBudget {
	b := &bodyBudget{}
	b.setLimit(limit)
	return b
}

// setLimit changes the budget (a reload); held reservations stay.
func (b *bodyBudget) setLimit(limit int64) {
	if limit == 0 {
		limit = defaultBodyBudget()
	}
	b.limit.Store(limit)
}

// reserve takes n bytes, or reports false when the budget has not n left.
func (b *bodyBudget) reserve(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.limit.Load() {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

func (b *bodyBudget) release(n int64) { b.used.Add(-n) }

// heldBody is one request body's reservation, released when the last of
// its holders lets go: the handler (it keeps the body for a retry), and
// each attempt's upstream request until the transport closes its body. A
// detached stream's handler returns while the transport may still hold
// the body: an upstream that answers before it has read the whole body
// keeps it until the exchange ends, and the budget counts it until then
// (it was released with the handler, and 8 streams of 4 MiB held 28 MiB
// of heap against an empty budget). A nil heldBody is a body within the
// allowance, reserved from nothing. Any goroutine may hold and let go.
type heldBody struct {
	budget   *bodyBudget
	reserved int64
	holders  atomic.Int32
}

// hold makes the handler the first holder of reserved bytes (nil for 0).
func (b *bodyBudget) hold(reserved int64) *heldBody {
	if reserved == 0 {
		return nil
	}
	h := &heldBody{budget: b, reserved: reserved}
	h.holders.Store(1)
	return h
}

// letGo ends one holder's hold; the last returns the bytes to the budget.
func (h *heldBody) letGo() {
	if h != nil && h.holders.Add(-1) == 0 {
		h.budget.release(h.reserved)
	}
}

// attempt is the body of one upstream attempt, holding the reservation
// until the transport has read it whole or closed it.
func (h *heldBody) attempt(body []byte) io.ReadCloser {
	if h != nil {
		h.holders.Add(1)
	}
	a := &attemptBody{held: h}
	a.r.Reset(body)
	return a
}

// attemptBody is an upstream request's body. The transport reads it in
// one goroutine and may close it from another (a cancelled HTTP/2
// stream), so both take mu. Once read whole, or closed, it drops its
// reference to the bytes and its hold on the budget: the transport has
// what it sends, and a transport sends a request again from a fresh body
// (GetBody), never by reading this one again. Net/http's HTTP/2
// transport closes a request's body only when its stream ends, so that a
// stream to a peer gateway held its request's bytes, and counted them,
// for as long as it lasted (TestRemoteStreamDoesNotPinItsRequestBody).
type attemptBody struct {
	mu   sync.Mutex
	r    bytes.Reader
	held *heldBody
	done bool // under mu: the bytes and the hold are let go
}

func (a *attemptBody) Read(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, err := a.r.Read(p)
	if a.r.Len() == 0 {
		a.dropLocked()
	}
	return n, err
}

func (a *attemptBody) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropLocked()
	return nil
}

// dropLocked lets go of the bytes and of the attempt's hold on the
// budget, once; a.mu is held.
func (a *attemptBody) dropLocked() {
	if !a.done {
		a.done = true
		a.r.Reset(nil)
		a.held.letGo()
	}
}

// defaultBodyBudget is a quarter of the memory limit, or 512 MiB without
// one: bodies are one of several things a gateway holds (streams,
// connections, the store), and the limit must stay reachable by the rest.
func defaultBodyBudget() int64 {
	limit := debug.SetMemoryLimit(-1)
	switch {
	case limit > 0 && limit == limitFromBodies.Load():
		return limit - bodyHeadroom // the limit was set from this default
	case limit > 0 && limit < math.MaxInt64:
		return limit / 4
	}
	return 512 << 20
}

// limitFromBodies is the memory limit SetMemoryLimitFromBodies set (0:
// none), so the default budget it was derived from stays what it was.
var limitFromBodies atomic.Int64

// bodyHeadroom is what the memory limit set from the body budget allows
// beyond the bodies: the rest of a gateway's heap (streams, connections,
// the store) and the garbage of bodies already released. Chosen so that
// resident memory under stalled bodies stays within the budget plus 128
// MiB: the limit counts the Go runtime's memory, not the binary's text or
// other mappings, which take about 16 MiB more (BenchmarkStalledBodies:
// peak RSS 615-630 MiB at 624; with 256 MiB of headroom, 758).
const bodyHeadroom = 112 << 20

// SetMemoryLimitFromBodies sets the Go memory limit to the body budget
// (limits.bodyBytes, or its default) plus bodyHeadroom when neither
// GOMEMLIMIT nor a cgroup gave one: without a limit the collector lets the
// heap reach twice what is live, and bodies released and admitted anew
// (stalled clients timing out, others taking their place) held 1 GiB of
// RSS against the 512 MiB budget. The limit is soft: past it the collector
// runs more often, never kills. It returns the limit set, or 0.
func SetMemoryLimitFromBodies(budget int64) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	if limit := debug.SetMemoryLimit(-1); limit > 0 && limit < math.MaxInt64 {
		return 0 // the cgroup's (SetMemoryLimitFromCgroup)
	}
	if budget == 0 {
		budget = defaultBodyBudget()
	}
	limit := budget + bodyHeadroom
	debug.SetMemoryLimit(limit)
	limitFromBodies.Store(limit)
	return limit
}

// SetMemoryLimitFromCgroup sets the Go memory limit to 90% of the cgroup's
// memory limit when GOMEMLIMIT is not set, so the collector works harder
// before the kernel kills the gateway, and the body budget has a limit to
// derive from. It returns the limit set, or 0 when it set none.
func SetMemoryLimitFromCgroup() int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || n <= 0 || n >= 1<<60 { // "max", or cgroup v1's "no limit"
			return 0
		}
		limit := n / 10 * 9
		debug.SetMemoryLimit(limit)
		return limit
	}
	return 0
}
