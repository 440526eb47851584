// Package hot holds the atomics that (nearly) every call touches, laid out
// for many cores: a Line of the counters one package writes on every call,
// on one cache line of its own (the root's, and the Pebble engine's each
// have one: they share none through the seam), and striped counters for the
// counts that many goroutines add to at once and few read.
package hot

import (
	"sync/atomic"
	"unsafe"

	"github.com/receiptstore/receipts/internal/mutate"
)

// Line is 64 bytes, allocated alone (new(Line)), so on one cache line.
type Line struct {
	// Gate counts in-flight calls, plus the root's closed bit once Close
	// has begun (root package).
	Gate atomic.Int64
	// Clock is the Pebble engine's time high-water mark (Unix ns): never
	// goes back.
	Clock atomic.Int64
	// Counters since open: claims, replays, commits, conflicts and
	// mismatches (root package).
	Claims, Replays, Commits, Conflicts, Mismatches atomic.Uint64
}

// Line must fit one cache line (a size class of its own): adding a field
// past 64 bytes fails to compile here.
const _ = uint8(64 - unsafe.Sizeof(Line{}))

// Stripe picks one of 1<<bits stripes for the calling goroutine: by the
// address of its stack, hashed, so that goroutines (which have stacks of
// their own, each at least 2 KiB) mostly use different stripes and a
// goroutine keeps to one (its cache lines stay where it runs). It is a
// multiply, where a random pick (rand.Uint32, ChaCha8) was about 180
// instructions, 5% of a replay from memory.
func Stripe(bits uint) int {
	var here byte
	a := uint64(uintptr(unsafe.Pointer(&here))) >> 10
	return int(a * 0x9e3779b97f4a7c15 >> (64 - bits))
}

// counterBits is log2 of a Counter's stripes.
const counterBits = 3

// Counter is a count that many goroutines add to at once and few read
// (the Pebble engine's replay-cache hits): its stripes are a cache line
// apart, so adds from different cores do not contend. The zero value is
// ready to use.
type Counter struct {
	s [1 << counterBits]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

// Add adds n.
func (c *Counter) Add(n uint64) { c.s[Stripe(counterBits)].n.Add(n) }

// Load returns the count: the sum of the stripes (adds racing with it may
// or may not be in it).
func (c *Counter) Load() uint64 {
	var sum uint64
	stripes := len(c.s)
	if mutate.Name == mutate.HistShard {
		stripes = 1
	}
	for i := range stripes {
		sum += c.s[i].n.Load()
	}
	return sum
}
