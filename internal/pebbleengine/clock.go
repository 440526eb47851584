package pebbleengine

import (
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// tokenBlock is how many fencing tokens are reserved by one synced write of
// the token ceiling. A restart skips what was left of the block.
const tokenBlock = 4096

// Now returns the store's time (see now).
func (e *Engine) Now(context.Context) (time.Time, error) { return e.time(e.now()), nil }

// now returns the store's time: Config.Now, but never earlier than any time
// the store has already used.
func (e *Engine) now() int64 {
	t := machine.ClockNanos(e.cfg.Now())
	for {
		hw := e.hot.Clock.Load()
		if t <= hw {
			return hw
		}
		if e.hot.Clock.CompareAndSwap(hw, t) {
			return t
		}
	}
}

// time converts store time to a time.Time in the clock's location.
func (e *Engine) time(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).In(e.loc)
}

// epochOf is the epoch a write at t lands in: never below the GC floor.
func (e *Engine) epochOf(t int64) uint64 {
	return max(uint64(max(t, 0)/e.width), e.floor.Load())
}

// newToken hands out the next fencing token, reserving a new block on disk
// (synced) when the current one is used up. Tokens are unique store-wide and
// never reused, across restarts and GC.
func (e *Engine) newToken() (uint64, error) {
	e.tok.Lock()
	defer e.tok.Unlock()
	if e.tok.next >= e.tok.ceil {
		ceil := e.tok.next + tokenBlock
		if err := e.pdb.Set(keys.TokenCeiling, encoding.EncodeUint64(ceil), pebble.Sync); err != nil {
			return 0, fmt.Errorf("receipts: reserve tokens: %w", err)
		}
		e.tok.ceil = ceil
	}
	t := e.tok.next
	e.tok.next++
	return t, nil
}

// LocalNow implements driver.LocalClock: Now, which does no I/O.
func (e *Engine) LocalNow() time.Time { return e.time(e.now()) }
