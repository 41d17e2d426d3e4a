package route

import (
	"sync"
	"sync/atomic"
)

// table maps keys to values made on their first use, read on the request
// path without a lock or an allocation: readers load an immutable map
// through an atomic pointer, and the rare writer (a key's first use, a
// topology change) copies it under mu and swaps it in. A sync.Map would
// box every key into an interface on every lookup, an allocation per
// request for a string or struct key. The keys are sites and models, a
// few hundred at most and written once each, so the copies cost nothing
// the request path sees. Any goroutine may call it; the zero table is
// empty and ready.
type table[K comparable, V any] struct {
	mu sync.Mutex // serialises writers; readers never take it
	m  atomic.Pointer[map[K]*V]
}

// lookup is k's value, if it was made.
func (t *table[K, V]) lookup(k K) (*V, bool) {
	if m := t.m.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	return nil, false
}

// get is k's value, a new zero V made first if there is none.
func (t *table[K, V]) get(k K) *V {
	if v, ok := t.lookup(k); ok {
		return v
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.lookup(k); ok { // made while this one waited
		return v
	}
	v := new(V)
	t.swap(func(m map[K]*V) { m[k] = v })
	return v
}

// retain drops the keys keep does not keep. It is called on every
// snapshot build, and copies the map only when a key goes.
func (t *table[K, V]) retain(keep func(K) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.m.Load()
	if p == nil {
		return
	}
	drop := false
	for k := range *p {
		if !keep(k) {
			drop = true
			break
		}
	}
	if !drop {
		return
	}
	t.swap(func(m map[K]*V) {
		for k := range m {
			if !keep(k) {
				delete(m, k)
			}
		}
	})
}

// swap stores a copy of the map changed by edit; t.mu held.
func (t *table[K, V]) swap(edit func(map[K]*V)) {
	var old map[K]*V
	if p := t.m.Load(); p != nil {
		old = *p
	}
	m := make(map[K]*V, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	edit(m)
	t.m.Store(&m)
}
