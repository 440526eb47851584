package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/mutate"
)

// GC implements driver.Engine: partition maintenance under the maintenance lease. It creates
// the partitions of the next PartitionsAhead epochs and removes every dead one (a records
// partition once its end plus Retention has passed: all of its records are past retention; a
// markers partition once its end plus Retention plus TombstoneWindow has) with DETACH PARTITION …
// CONCURRENTLY and DROP TABLE, each statement on its own (DETACH CONCURRENTLY cannot run in a
// transaction block), under a lock_timeout. With tombstones on (on any node: the window in
// meta), a records partition's markers are written first (copyMarkers: one INSERT … SELECT
// from the partition, committed before the DETACH), since until then its records were their
// own tombstones: a crash between the two leaves both, never neither. Cost: O(partitions)
// statements, whatever the number of records; the copy reads the partition once and writes
// a marker for each record whose tombstone is still in force.
//
// One node at a time runs it: the pass first takes (or renews) the lease row in meta and stops
// if another node holds an unexpired lease (the stats then say nothing was done). The holder
// keeps the lease after the pass until it runs out, so a crashed holder is replaced by the next
// node whose GC runs after MaintLease. An interrupted DETACH CONCURRENTLY is completed with
// FINALIZE by whichever node runs next.
func (e *engine) GC(ctx context.Context) (driver.GCStats, error) {
	start := time.Now()
	var st driver.GCStats
	now, metaRet, metaWin, ok, err := e.maintLease(ctx)
	if err != nil {
		return st, err
	}
	st.At = now
	st.Writes = 1
	if !ok {
		st.Duration = time.Since(start)
		return st, nil
	}
	cur := e.epochOf(now)
	for ep := cur; ep <= cur+int64(e.o.PartitionsAhead); ep++ {
		if err := e.ensurePartition(ctx, ep); err != nil {
			return st, err
		}
	}
	parts, err := e.partitions(ctx)
	if err != nil {
		return st, errorf("pgstore: gc: list partitions: %w", err)
	}
	// a node with a longer Retention (or TombstoneWindow) wrote meta last, or this one has:
	// keep the longer
	ret := max(e.o.Retention, time.Duration(metaRet)*time.Microsecond)
	win := max(e.o.TombstoneWindow, time.Duration(metaWin)*time.Microsecond, 0)
	for _, p := range parts {
		keep := ret
		if p.family == famMarkers {
			keep = ret + win // tombstones off everywhere: markers (none written) go with records
		}
		if e.partEnd(p).Add(keep).After(now) {
			continue
		}
		if _, _, _, ok, err := e.maintLease(ctx); err != nil || !ok {
			st.Duration = time.Since(start)
			return st, err // the lease went to another node: it carries on
		}
		st.Writes++
		if p.family == famRecords && win > 0 && mutate.Name != mutate.PgNoGCMarkers {
			n, err := e.copyMarkers(ctx, p, ret+win)
			if err != nil {
				st.Duration = time.Since(start)
				return st, err
			}
			st.Writes++
			st.MarkersWritten += int(n)
		}
		if err := e.dropPartition(ctx, p); err != nil {
			st.Duration = time.Since(start)
			return st, err
		}
		st.Writes += 2
		if p.family == famMarkers {
			st.TombstoneEpochsDropped++
		} else {
			st.EpochsDropped++
		}
		st.BytesFreed += uint64(max(p.bytes, 0))
	}
	st.Duration = time.Since(start)
	return st, nil
}

// copyMarkers writes the markers of records partition p's records whose tombstones are still
// in force (tomb: Retention + TombstoneWindow, GC's), in one statement committed on its own,
// before GC detaches p: nothing writes to a dead partition any more (every write is fenced
// to records within Retention and moves its row to the current epoch), and a claim whose
// snapshot predates this commit still sees p (DETACH CONCURRENTLY waits for it). Returns the
// markers written.
func (e *engine) copyMarkers(ctx context.Context, p partition, tomb time.Duration) (int64, error) {
	tag, err := e.pool.Exec(ctx, e.q.copyMarkersSQL(p.name), e.nowArg(), tomb.Microseconds())
	if err != nil {
		return 0, errorf("pgstore: gc: markers of %s: %w", p.name, err)
	}
	return tag.RowsAffected(), nil
}

// maintLease takes or renews the maintenance lease, and records the engine's time in meta
// (clock: a restart with the clock behind resumes from it). ok: this engine holds it.
func (e *engine) maintLease(ctx context.Context) (now time.Time, retentionUS, windowUS int64, ok bool, err error) {
	arg := e.nowArg()
	err = e.pool.QueryRow(ctx, `UPDATE `+e.q.schema+`.meta m
   SET maint_owner = $1, maint_until = t.n + $2::bigint * interval '1 microsecond',
       clock = greatest(m.clock, t.n)
  FROM (SELECT `+e.q.clock("$3")+` AS n) t
 WHERE m.maint_owner = $1 OR m.maint_until IS NULL OR m.maint_until <= t.n
RETURNING t.n, m.retention_us, coalesce(m.tombstone_window_us, 0)`, e.me, e.o.MaintLease.Microseconds(), arg).Scan(&now, &retentionUS, &windowUS)
	if errors.Is(err, pgx.ErrNoRows) {
		now, err = e.Now(ctx)
		return now, 0, 0, false, err
	}
	if err != nil {
		return now, 0, 0, false, errorf("pgstore: gc: maintenance lease: %w", err)
	}
	return e.saw(now, arg), retentionUS, windowUS, true, nil
}

// dropPartition detaches (concurrently, or finishing an interrupted detach) and drops p.
func (e *engine) dropPartition(ctx context.Context, p partition) error {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return errorf("pgstore: gc: %w", err)
	}
	defer conn.Release()
	qn := e.q.schema + "." + pgx.Identifier{p.name}.Sanitize()
	stmts := []string{"SET lock_timeout = '5s'"}
	switch {
	case p.pending:
		stmts = append(stmts, `ALTER TABLE `+e.q.schema+`.`+p.family+` DETACH PARTITION `+qn+` FINALIZE`)
	case p.attached:
		stmts = append(stmts, `ALTER TABLE `+e.q.schema+`.`+p.family+` DETACH PARTITION `+qn+` CONCURRENTLY`)
	}
	stmts = append(stmts, `DROP TABLE IF EXISTS `+qn)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout") }()
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return errorf("pgstore: gc: drop %s: %w", p.name, err)
		}
	}
	return nil
}
