// Package affinity holds the gateway's session table: which site (and
// provider) served a session last, so its next turn goes where its KV cache
// lives (docs/routing.md, affinity). The table is bounded in entries and in
// bytes, evicts the least recently used, and forgets a session after its
// time to live.
package affinity

import (
	"container/list"
	"sync"
)

// Binding is where a session was served.
type Binding struct {
	Site, Provider string
}

// Bounds cap the table.
type Bounds struct {
	// TTLMs is how long a binding lives after its last use.
	TTLMs int64
	// MaxEntries and MaxBytes cap the sessions held and the bytes their keys
	// and bindings take (entryOverhead each on top).
	MaxEntries int
	MaxBytes   int64
}

// entryOverhead approximates what one entry costs besides its strings: the
// list element, the map slot and the entry itself.
const entryOverhead = 160

// Outcome is what a lookup or a binding found, the outcome label of
// grid_route_affinity_total.
type Outcome uint8

// Outcomes of the table. The gateway adds reused and failover, which depend
// on the snapshot.
const (
	// Missing: no binding.
	Missing Outcome = iota
	// Found: a live binding.
	Found
	// Expired: a binding older than its TTL, dropped.
	Expired
)

// Table is a bounded LRU of session bindings. Any goroutine may call it; one
// mutex guards everything, held for a map lookup and a list move.
type Table struct {
	mu      sync.Mutex
	bounds  Bounds
	entries map[string]*list.Element
	lru     list.List // front: most recently used; values *entry
	bytes   int64
}

type entry struct {
	key       string
	binding   Binding
	expiresMs int64
}

// New returns an empty table.
func New(b Bounds) *Table {
	return &Table{bounds: b, entries: map[string]*list.Element{}}
}

// SetBounds applies new caps (a reload), evicting what no longer fits; it
// returns how many entries it evicted.
func (t *Table) SetBounds(b Bounds) (evicted int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bounds = b
	return t.shrink()
}

// Lookup returns key's binding at nowMs. A live binding is refreshed (its
// TTL starts again) and moved to the front; an expired one is dropped.
func (t *Table) Lookup(key string, nowMs int64) (Binding, Outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.entries[key]
	if !ok {
		return Binding{}, Missing
	}
	e := el.Value.(*entry)
	if nowMs >= e.expiresMs {
		t.remove(el)
		return Binding{}, Expired
	}
	e.expiresMs = nowMs + t.bounds.TTLMs
	t.lru.MoveToFront(el)
	return e.binding, Found
}

// Bind binds key to b at nowMs, evicting the least recently used entries
// the caps require; it returns how many it evicted. A key larger than the
// byte cap alone is not kept (and counts as evicted).
func (t *Table) Bind(key string, b Binding, nowMs int64) (evicted int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.entries[key]; ok {
		e := el.Value.(*entry)
		t.bytes += size(key, b) - size(key, e.binding)
		e.binding, e.expiresMs = b, nowMs+t.bounds.TTLMs
		t.lru.MoveToFront(el)
		return t.shrink()
	}
	if size(key, b) > t.bounds.MaxBytes || t.bounds.MaxEntries < 1 {
		return 1
	}
	t.entries[key] = t.lru.PushFront(&entry{key: key, binding: b, expiresMs: nowMs + t.bounds.TTLMs})
	t.bytes += size(key, b)
	return t.shrink()
}

// Len and Bytes are the table's size now.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// Bytes is what the entries take, overhead included.
func (t *Table) Bytes() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bytes
}

// shrink evicts from the back until the caps hold, and returns how many it
// evicted; t.mu is held.
func (t *Table) shrink() (evicted int) {
	for len(t.entries) > 0 && (len(t.entries) > t.bounds.MaxEntries || t.bytes > t.bounds.MaxBytes) {
		t.remove(t.lru.Back())
		evicted++
	}
	return evicted
}

// remove drops one element; t.mu is held.
func (t *Table) remove(el *list.Element) {
	e := t.lru.Remove(el).(*entry)
	delete(t.entries, e.key)
	t.bytes -= size(e.key, e.binding)
}

func size(key string, b Binding) int64 {
	return int64(len(key)+len(b.Site)+len(b.Provider)) + entryOverhead
}
