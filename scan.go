package receipts

import (
	"context"
	"fmt"
	"iter"

	"github.com/receiptstore/receipts/driver"
)

// Filter selects the records Scan returns. The zero Filter selects every
// visible record.
type Filter struct {
	Scope     string // "" = every scope
	State     State  // 0 = any state
	Abandoned bool   // only Pending records whose lease has run out: outcomes to reconcile
	Limit     int    // 0 = no limit
}

// Validate reports a Filter that Scan rejects: a scope over MaxKeyPartLen
// (ErrInvalidKey), an unknown state or a negative limit
// (ErrInvalidArgument). Scan calls it; a caller that must fail before it
// starts answering (an HTTP handler) can call it first.
func (f Filter) Validate() error {
	if len(f.Scope) > MaxKeyPartLen {
		return fmt.Errorf("%w: filter scope of %d bytes", ErrInvalidKey, len(f.Scope))
	}
	if f.State > Failed {
		return fmt.Errorf("%w: filter state %d", ErrInvalidArgument, f.State)
	}
	if f.Limit < 0 {
		return fmt.Errorf("%w: negative limit", ErrInvalidArgument)
	}
	return nil
}

// Scan returns the visible records that match f, in storage order (by epoch
// of last write, then scope, then ID), from a consistent snapshot. It is an
// operator's tool: Options.BeforeReplay is not called. Tombstones (keys past
// retention within Options.TombstoneWindow) are not records: Scan does not
// list them; DB.Tombstones does. A record that does not
// decode is reported as an error wrapping ErrCorrupt, and the scan goes on if
// the caller continues.
//
// Scan reports only what a crash cannot take away: before it yields
// anything it syncs the engine's write-ahead log up to its snapshot (one
// fsync per Scan, not per record), so a commit whose sync is still running
// makes Scan wait for that sync. Every field it reports is durable,
// including a lease expiry that Renew wrote without a sync.
func (db *DB) Scan(ctx context.Context, f Filter) iter.Seq2[*Receipt, error] {
	return func(yield func(*Receipt, error) bool) {
		if err := db.enter(); err != nil {
			yield(nil, err)
			return
		}
		defer db.exit()
		if err := f.Validate(); err != nil {
			yield(nil, err)
			return
		}
		df := driver.Filter{State: driver.State(f.State), Abandoned: f.Abandoned, Limit: f.Limit}
		if f.Scope != "" {
			df.Scope = db.storedScope(f.Scope) // Options.HashKeys (privacy.go)
		}
		for rec, err := range db.eng.Scan(ctx, df) {
			if err != nil {
				if !yield(nil, err) {
					return
				}
				continue
			}
			if err := db.seal.Open(ctx, &rec); err != nil {
				if !yield(nil, err) {
					return
				}
				continue
			}
			r := newReceipt(&rec)
			r.Key = db.shownKey(rec.Key, f.Scope)
			if !yield(r, nil) {
				return
			}
		}
	}
}
