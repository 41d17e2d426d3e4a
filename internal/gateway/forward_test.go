package gateway

import "testing"

// TestCopyBufferGoesBackWhole: the buffer a proxied answer is copied
// through returns to its pool without an allocation, for a stream's small
// buffer and an answer's large one.
func TestCopyBufferGoesBackWhole(t *testing.T) {
	for _, stream := range []bool{false, true} {
		c := &copyBuffer{ans: &answer{stream: stream}}
		c.Put(c.Get()) // the pool's first buffer is made
		if n := testing.AllocsPerRun(100, func() { c.Put(c.Get()) }); n != 0 {
			t.Errorf("stream %v: %v allocations a Get and Put, want 0", stream, n)
		}
	}
}
