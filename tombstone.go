package receipts

import (
	"context"

	"iter"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Tombstone is what the store keeps of a key whose receipt is past
// retention, for Options.TombstoneWindow: the key and the times, never the
// fingerprint or the result. While it lasts, a claim of the key returns
// ErrExpired.
type Tombstone struct {
	Key Key
	// UsedAt is the last write of the key's record.
	UsedAt time.Time
	// ExpiredAt is when the record's retention ended.
	ExpiredAt time.Time
	// Until is when the tombstone ends and the key is free again.
	Until time.Time
}

// Left is how long t has left at now (zero once it has ended).
func (t *Tombstone) Left(now time.Time) time.Duration { return max(t.Until.Sub(now), 0) }

func newTombstone(t *driver.Tombstone) *Tombstone {
	return &Tombstone{Key: Key(t.Key), UsedAt: t.UsedAt, ExpiredAt: t.ExpiredAt, Until: t.Until}
}

// Tombstones yields the tombstones in force whose key is in scope ("" =
// every scope), at most limit of them (0 = no limit), for operators
// (receiptctl): Scan does not list them. With tombstones off it yields
// nothing. Like Scan, it reports only what a crash cannot take away.
func (db *DB) Tombstones(ctx context.Context, scope string, limit int) iter.Seq2[*Tombstone, error] {
	return func(yield func(*Tombstone, error) bool) {
		if err := db.enter(); err != nil {
			yield(nil, err)
			return
		}
		defer db.exit()
		f := Filter{Scope: scope, Limit: limit}
		if err := f.Validate(); err != nil {
			yield(nil, err)
			return
		}
		if db.tombs == nil {
			return
		}
		stored := scope
		if scope != "" {
			stored = db.storedScope(scope) // Options.HashKeys (privacy.go)
		}
		for t, err := range db.tombs.ScanTombstones(ctx, stored, limit) {
			if err != nil {
				if !yield(nil, err) {
					return
				}
				continue
			}
			tb := newTombstone(&t)
			tb.Key = db.shownKey(t.Key, scope)
			if !yield(tb, nil) {
				return
			}
		}
	}
}

// tombstone returns k's tombstone in force, or nil.
func (db *DB) tombstone(ctx context.Context, k Key) (*Tombstone, error) {
	if db.tombs == nil {
		return nil, nil
	}
	sk, err := db.storedKey(k)
	if err != nil {
		return nil, err
	}
	t, found, err := db.tombs.Tombstone(ctx, sk)
	if err != nil || !found {
		return nil, err
	}
	tb := newTombstone(&t)
	tb.Key = k
	return tb, nil
}
