package pgstore

import "sync"

// hintCap bounds one generation of the finished-key hint: at most 2×hintCap key hashes are
// remembered (16 bytes each and the record's epoch, 8, plus the map's overhead: about 2.5 MiB
// in all).
const hintCap = 1 << 14

// finishedHint remembers the keys this engine recently saw finished (its own Finish and
// DoTx commits, and the replays it answered). It only picks the first statement of a claim,
// never its answer:
//   - a key in the hint is probably a retry of a finished operation, so Claim tries the
//     replay fast path first (one plain read, no lock: replayfast.go);
//   - any other key is probably new, so Claim goes straight to the claim batch, whose fresh
//     statement also returns the key's record if it has one (claimfresh.go): a first call
//     costs one round trip, and a retry this engine has not seen (it finished on another
//     node, or long ago) one round trip too.
//
// It also remembers the epoch of the record it saw finished (the partition of its last write,
// epochOf its UpdatedAt), so that the fast path's read goes to that one partition (lookupIn)
// instead of the parent's ordered Append over every live partition, whose executor start-up
// (one index scan set up per partition) costs the server more than the read itself.
//
// A wrong guess costs a round trip, never a wrong answer: the fast path hands anything but a
// finished, visible record to the claim path. Two generations: when the current one is full,
// it becomes the old one and the one before is dropped, so the hint holds the most recently
// seen keys and never grows past its bound.
type finishedHint struct {
	mu       sync.Mutex
	cur, old map[[16]byte]int64 // key hash → the record's epoch
}

// add remembers that k was seen finished, its record in epoch.
func (h *finishedHint) add(k [16]byte, epoch int64) {
	h.mu.Lock()
	if h.cur == nil {
		h.cur = make(map[[16]byte]int64, 64)
	}
	if len(h.cur) >= hintCap {
		h.old, h.cur = h.cur, make(map[[16]byte]int64, hintCap/4)
	}
	h.cur[k] = epoch
	h.mu.Unlock()
}

// get reports whether k was seen finished, and the epoch its record was in.
func (h *finishedHint) get(k [16]byte) (epoch int64, ok bool) {
	h.mu.Lock()
	epoch, ok = h.cur[k]
	if !ok {
		epoch, ok = h.old[k]
	}
	h.mu.Unlock()
	return epoch, ok
}
