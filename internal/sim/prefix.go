package sim

import (
	"container/list"
	"encoding/json"
)

// A prompt is cached by blocks of prefixBlockTokens tokens, as vLLM's
// automatic prefix caching does: a block is known by the hash of its own
// bytes chained to its predecessor's, so a block matches only with the
// whole prefix before it. The sim counts four bytes a token
// (estimateTokens).
const (
	prefixBlockTokens = 16
	prefixBlockBytes  = prefixBlockTokens * 4
)

// promptBlocks returns the chained hashes of the prompt's full blocks.
// Only full blocks are cached; the tail of a prompt is always prefilled.
func promptBlocks(raw ...json.RawMessage) []uint64 {
	var all []byte
	for _, r := range raw {
		all = append(all, r...)
	}
	blocks := make([]uint64, 0, len(all)/prefixBlockBytes)
	h := uint64(14695981039346656037)
	for i := 0; i+prefixBlockBytes <= len(all); i += prefixBlockBytes {
		for _, b := range all[i : i+prefixBlockBytes] {
			h = (h ^ uint64(b)) * 1099511628211
		}
		blocks = append(blocks, h)
	}
	return blocks
}

// prefixCache is an engine's cache of prompt blocks, least recently used
// evicted first. Engine.mu guards it.
type prefixCache struct {
	capacity int // blocks
	blocks   map[uint64]*list.Element
	lru      list.List // front: most recent; values uint64
}

func newPrefixCache(tokens int) *prefixCache {
	if tokens < prefixBlockTokens {
		return nil
	}
	return &prefixCache{capacity: tokens / prefixBlockTokens, blocks: map[uint64]*list.Element{}}
}

// admit returns how many of blocks' leading blocks were cached, and caches
// them all.
func (c *prefixCache) admit(blocks []uint64) (hits int) {
	leading := true
	for _, b := range blocks {
		if el, ok := c.blocks[b]; ok {
			if leading {
				hits++
			}
			c.lru.MoveToFront(el)
			continue
		}
		leading = false
		c.blocks[b] = c.lru.PushFront(b)
		if c.lru.Len() > c.capacity {
			delete(c.blocks, c.lru.Remove(c.lru.Back()).(uint64))
		}
	}
	return hits
}
