package gateway

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
)

// bodyBudget bounds the request bodies held in memory across every
// connection: a body is read only into capacity reserved from it, and the
// reservation is held until the request is done (the body is kept for a
// retry). Any goroutine may reserve and release.
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

// defaultBodyBudget is a quarter of the memory limit, or 512 MiB without
// one: bodies are one of several things a gateway holds (streams,
// connections, the store), and the limit must stay reachable by the rest.
func defaultBodyBudget() int64 {
	if limit := debug.SetMemoryLimit(-1); limit > 0 && limit < math.MaxInt64 {
		return limit / 4
	}
	return 512 << 20
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
