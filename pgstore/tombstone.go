package pgstore

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// Tombstones (receipts.Options.TombstoneWindow) on PostgreSQL.
//
// While tombstones are on, every statement that writes a record (a claim, a takeover, renew,
// finish, abandon) also upserts the key's marker in the markers partition of the record's new
// epoch, holding the record's updated_at: one statement, no extra round trip. A record moved
// to a newer epoch leaves its older markers behind; they hold older times and the newest
// marker decides. Release of a first attempt and Forget delete the key's markers with the
// record (no effect to protect). So a key without a visible record is tombstoned while its
// newest write, at usedAt, satisfies now < usedAt + Retention + TombstoneWindow: the claim
// statements check the markers (queries.fresh: a NOT EXISTS in the insert's condition;
// queries.claim: the tomb CTE, run only when the key has no visible record) and answer
// 'expired'. GC drops a markers partition once its end plus Retention plus TombstoneWindow
// has passed (the longest recorded by any node), as it drops records partitions after
// Retention: O(partitions) statements, whatever the number of markers.

var _ driver.Tombstones = (*engine)(nil)

// Tombstone implements driver.Tombstones: k's tombstone in force, found false if k has a
// visible record or none.
func (e *engine) Tombstone(ctx context.Context, k driver.Key) (driver.Tombstone, bool, error) {
	if !e.q.tombs {
		return driver.Tombstone{}, false, nil
	}
	var usedAt, now time.Time
	arg := e.nowArg()
	err := e.pool.QueryRow(ctx, e.q.tombstone, []byte(k.Scope), []byte(k.ID), e.markerBottom(), e.oldest(), arg,
		e.tombUS(), e.retentionUS()).Scan(&usedAt, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return driver.Tombstone{}, false, nil
	case err != nil:
		return driver.Tombstone{}, false, fmt.Errorf("pgstore: tombstone: %w", err)
	}
	e.saw(now, arg)
	return e.tombstoneOf(k, usedAt), true, nil
}

// tombstoneOf is the tombstone of k whose record was last written at usedAt.
func (e *engine) tombstoneOf(k driver.Key, usedAt time.Time) driver.Tombstone {
	exp := usedAt.Add(e.o.Retention)
	return driver.Tombstone{Key: k, UsedAt: usedAt, ExpiredAt: exp, Until: exp.Add(max(e.o.TombstoneWindow, 0))}
}

// ScanTombstones implements driver.Tombstones: the tombstones in force of scope ("" = every
// scope), oldest epoch first, page by page (each page its own statement and snapshot).
func (e *engine) ScanTombstones(ctx context.Context, scope string, limit int) iter.Seq2[driver.Tombstone, error] {
	return func(yield func(driver.Tombstone, error) bool) {
		if !e.q.tombs {
			return
		}
		afterEpoch, afterScope, afterID := int64(-1<<63), []byte{}, []byte{}
		n := 0
		for {
			page := scanPage
			if limit > 0 {
				page = min(page, limit-n)
			}
			arg := e.nowArg()
			rows, err := e.pool.Query(ctx, e.q.scanTombstones, e.markerBottom(), []byte(scope), arg, e.tombUS(),
				e.retentionUS(), e.oldest(), afterEpoch, afterScope, afterID, page)
			if err != nil {
				yield(driver.Tombstone{}, fmt.Errorf("pgstore: scan tombstones: %w", err))
				return
			}
			var out []driver.Tombstone
			for rows.Next() {
				var s, id []byte
				var usedAt, now time.Time
				if err := rows.Scan(&afterEpoch, &s, &id, &usedAt, &now); err != nil {
					rows.Close()
					yield(driver.Tombstone{}, fmt.Errorf("pgstore: scan tombstones: %w", err))
					return
				}
				e.saw(now, arg)
				afterScope, afterID = s, id
				out = append(out, e.tombstoneOf(driver.Key{Scope: string(s), ID: string(id)}, usedAt))
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				yield(driver.Tombstone{}, fmt.Errorf("pgstore: scan tombstones: %w", err))
				return
			}
			for _, t := range out {
				if !yield(t, nil) {
					return
				}
			}
			n += len(out)
			if len(out) < page || (limit > 0 && n >= limit) {
				return
			}
		}
	}
}
