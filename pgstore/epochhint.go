package pgstore

import (
	"sync"

	"github.com/receiptstore/receipts/internal/mutate"
)

// epochHintCap bounds the tokens remembered (a lease that is never finished leaves its entry
// until the room is needed; 16 bytes each plus the map's overhead).
const epochHintCap = 1 << 15

// epochHint remembers, per fencing token this engine handed out, the epoch its record was
// last written in, so that a fenced write of that token (renew, finish, abandon, release)
// searches only the partitions from there on: the parent's run-time pruning then skips the
// older live partitions at executor start (bench/README.md, "Per statement": a finish through
// the parent over three partitions took 39–49 µs, aimed at its own 28–33).
//
// Why the bound holds: a record keeps its token only while its holder rewrites it (a
// takeover gives it a new token), and every write moves the record to the epoch of its
// statement's time. This engine's statement times never go backwards: the clock parameter
// is raised to the engine's high-water mark (nowArg), which already holds the time of the
// claim (saw). So the record of a token lives at or above the epoch of the time this engine
// last saw it written; the bound is one epoch lower still, so that no rounding of the
// database's epoch arithmetic can matter. A token the engine does not know (evicted, or
// another engine's) searches from the oldest live partition, as before.
type epochHint struct {
	mu sync.Mutex
	m  map[uint64]int64
}

// set remembers that token's record was written in epoch ep (or later).
func (h *epochHint) set(token uint64, ep int64) {
	h.mu.Lock()
	if h.m == nil {
		h.m = make(map[uint64]int64, 64)
	}
	if _, ok := h.m[token]; !ok && len(h.m) >= epochHintCap {
		for t := range h.m { // any one
			delete(h.m, t)
			break
		}
	}
	h.m[token] = ep
	h.mu.Unlock()
}

// forget drops token (its lease is over).
func (h *epochHint) forget(token uint64) {
	h.mu.Lock()
	delete(h.m, token)
	h.mu.Unlock()
}

// low returns the oldest epoch a fenced write of token must search, given the oldest live
// one.
func (h *epochHint) low(token uint64, oldest int64) int64 {
	h.mu.Lock()
	ep, ok := h.m[token]
	h.mu.Unlock()
	if !ok {
		return oldest
	}
	if mutate.Name == mutate.PgEpochHint {
		return max(oldest, ep+1) // the record's own epoch is skipped: its holder loses it
	}
	return max(oldest, ep-1)
}

func (h *epochHint) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}
