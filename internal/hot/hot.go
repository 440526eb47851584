// Package hot holds the atomics that (nearly) every call touches, the root
// package's and the Pebble engine's together, on one cache line of their
// own: a call moves one line between cores, not several.
package hot

import (
	"sync/atomic"
	"unsafe"
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
	// mismatches (root package), replay-cache hits (Pebble engine).
	Claims, Replays, Commits, CacheHits, Conflicts, Mismatches atomic.Uint64
}

// Line must fit one cache line (a size class of its own): adding a field
// past 64 bytes fails to compile here.
const _ = uint8(64 - unsafe.Sizeof(Line{}))
