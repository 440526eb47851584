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

// expired is the error of a claim of k answered Expired (the receipt's
// retention ended at expiredAt).
func (db *DB) expired(k Key, expiredAt time.Time) error {
	db.n.expired.Add(1)
	return &ExpiredError{Key: k, ExpiredAt: expiredAt, Until: expiredAt.Add(max(db.opts.TombstoneWindow, 0)), db: db}
}

// keyTooOld returns ErrExpired if Options.KeyTime says k was minted more
// than Retention + TombstoneWindow ago by the store's clock.
func (db *DB) keyTooOld(ctx context.Context, k Key) error {
	minted, ok := db.opts.KeyTime(k.ID)
	if !ok {
		return nil
	}
	now, err := db.keyClock(ctx)
	if err != nil {
		return err
	}
	if now.Sub(minted) >= db.opts.Retention+max(db.opts.TombstoneWindow, 0) {
		db.n.expired.Add(1)
		return &ExpiredError{Key: k, db: db}
	}
	return nil
}

// keyClock is the time KeyTime's answers are compared with: the engine's
// clock where it is read without I/O (driver.LocalClock: Pebble's), Options.Now, or the process's clock for an
// engine whose clock is remote (a key's mint time comes from some
// client's clock anyway).
func (db *DB) keyClock(ctx context.Context) (time.Time, error) {
	if c, ok := db.eng.(driver.LocalClock); ok {
		return c.LocalNow(), nil
	}
	return db.clock(), nil
}
