package pgstore

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// Tombstones (receipts.Options.TombstoneWindow) on PostgreSQL.
//
// No record write writes a marker (format 3). While tombstones are on, a record past
// Retention is its own tombstone for as long as its partition stands: a key without a
// visible record is tombstoned while its newest write, at usedAt (its newest record, in any
// partition GC has not dropped, or its newest marker), satisfies
// now < usedAt + Retention + TombstoneWindow. The claim statements check both (queries.fresh:
// NOT EXISTS on the markers and on the records partitions below the live ones;
// queries.claim: the tomb CTE, run only when the key has no visible record) and answer
// 'expired'. GC, before it drops a records partition, copies the markers its records still
// need into the markers family with one INSERT … SELECT, committed before the DETACH
// (engine.copyMarkers): a crash between them leaves the records and the markers, never
// neither. Release of a first attempt and Forget delete the record (and any marker a
// format-2 binary wrote): there is nothing for GC to copy. GC drops a markers partition once
// its end plus Retention plus TombstoneWindow has passed (the longest recorded by any node),
// as it drops records partitions after Retention: O(partitions) statements, whatever the
// number of markers. Markers a format-2 binary wrote beside every record stay in force and
// are honoured the same way.

var _ driver.Tombstones = (*engine)(nil)

// Tombstone implements driver.Tombstones: k's tombstone in force, found false if k has a
// visible record or none.
func (e *engine) Tombstone(ctx context.Context, k driver.Key) (driver.Tombstone, bool, error) {
	if !e.q.tombs {
		return driver.Tombstone{}, false, nil
	}
	var usedAt, now time.Time
	arg := e.nowArg()
	err := e.pool.QueryRow(ctx, e.q.tombstone, []byte(k.Scope), []byte(k.ID), e.markerBottom(), e.recordBottom(), arg,
		e.tombUS(), e.retentionUS()).Scan(&usedAt, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return driver.Tombstone{}, false, nil
	case err != nil:
		return driver.Tombstone{}, false, errorf("pgstore: tombstone: %w", err)
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
				e.retentionUS(), e.recordBottom(), afterEpoch, afterScope, afterID, page)
			if err != nil {
				yield(driver.Tombstone{}, errorf("pgstore: scan tombstones: %w", err))
				return
			}
			var out []driver.Tombstone
			for rows.Next() {
				var s, id []byte
				var usedAt, now time.Time
				if err := rows.Scan(&afterEpoch, &s, &id, &usedAt, &now); err != nil {
					rows.Close()
					yield(driver.Tombstone{}, errorf("pgstore: scan tombstones: %w", err))
					return
				}
				e.saw(now, arg)
				afterScope, afterID = s, id
				out = append(out, e.tombstoneOf(driver.Key{Scope: string(s), ID: string(id)}, usedAt))
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				yield(driver.Tombstone{}, errorf("pgstore: scan tombstones: %w", err))
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
