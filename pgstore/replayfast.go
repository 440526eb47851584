package pgstore

import (
	"context"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// replayFast answers a claim of a key whose record is finished from one plain MVCC read (the
// lookup statement: no transaction id, no advisory lock, no row lock, nothing written), before
// the gated claim path runs. ok is false, and the caller runs the claim path unchanged, for
// everything else: no visible record, a Pending record (a claim may take it over or report it
// in progress), a record past retention at the read's time (a claim resets it), any state
// this code does not know (tombstones, later formats), any error (lost replies included: the
// claim path retries them with its nonce), and once the DB's Close has begun (the claim path
// refuses it).
//
// Why the answer is the claim path's: a finished record (Succeeded, Failed) is never changed
// while it is visible. Finish, Renew and Abandon are fenced on a Pending record; a takeover
// only rewrites a Pending record whose lease ran out, or a record past retention; Release and
// Forget delete Pending records only; GC drops partitions whose records are all past
// retention. So the newest row of the key in the live partitions, read on one snapshot, is
// what the claim statement's cur would see, and with the same clock (the injected time or the
// database's, never below the engine's high-water mark) and the same visibility test
// (now < updated_at + Retention) the claim statement would answer "done" (same fingerprint:
// Replay) or "mismatch" (another: Mismatch) with this record and this time. A record that
// became visible after the read's snapshot is missed, and then the claim path answers: a
// fast answer is never one the claim path could not have given at the read's time.
//
// epoch is where the hint saw the record (lookupIn): the read goes to that partition alone,
// and to the parent only if the record is no longer there.
func (e *engine) replayFast(ctx context.Context, req driver.ClaimRequest, epoch int64) (driver.ClaimResult, bool) {
	if e.closing() || e.testNoReplayFast {
		return driver.ClaimResult{}, false
	}
	rec, found, now, err := e.lookupIn(ctx, req.Key, epoch)
	if err != nil || !found || (rec.State != driver.Succeeded && rec.State != driver.Failed) {
		return driver.ClaimResult{}, false
	}
	e.replayFastHits.Add(1)
	e.hint.add(keyHash(req.Key), e.epochOf(rec.UpdatedAt))
	res := driver.ClaimResult{Outcome: driver.Replay, Record: rec, Now: now}
	if string(rec.Fingerprint) != string(req.Fingerprint) {
		res.Outcome = driver.Mismatch
	}
	return res, true
}

// lookupIn is Lookup reading only the records partition of epoch, where the hint last saw k's
// record: one index probe of one table, without the parent's Append, whose executor start-up
// sets up an index scan in every live partition (bench/README.md, "Replay in one partition").
// It gives Lookup's answer: a key has at most one row in the live partitions (a claim inserts
// a row only when its probe of every live partition, under the key's lock, found none, and
// every later write moves that row to its own epoch in the same statement), so a row found
// in epoch's partition is the one the parent's read would return, read on one snapshot with
// the same clock and visibility test. When the partition holds no row of k (the record moved
// to a later epoch, was deleted, or epoch is no longer live), or the read fails, Lookup
// answers instead.
//
// Reads of different keys that arrive together are sent as one statement (lookupbatch.go).
func (e *engine) lookupIn(ctx context.Context, k driver.Key, epoch int64) (driver.Record, bool, time.Time, error) {
	if epoch < e.oldest() || e.testNoLookupIn {
		return e.Lookup(ctx, k)
	}
	if !e.testNoBatch {
		c := &lookupCall{ctx: ctx, key: k, v: lookupV{epoch: epoch}}
		if !e.lookups.do(c) {
			return driver.Record{}, false, time.Time{}, ctx.Err()
		}
		if v := &c.v; v.done {
			return v.rec, v.found, v.now, v.err
		}
	}
	return e.lookupInAlone(ctx, k, epoch)
}

// lookupInAlone is lookupIn's read of one key.
func (e *engine) lookupInAlone(ctx context.Context, k driver.Key, epoch int64) (driver.Record, bool, time.Time, error) {
	var rec driver.Record
	var now time.Time
	arg := e.nowArg()
	err := scanRecord(e.pool.QueryRow(ctx, e.lookupInSQL(epoch), []byte(k.Scope), []byte(k.ID), arg), &rec, &now)
	if err != nil {
		return e.Lookup(ctx, k)
	}
	now = e.saw(now, arg)
	e.lookupInHits.Add(1)
	return e.lookupInAnswer(k, rec, now)
}

// lookupInAnswer is lookupIn's answer from the row of k read in its partition at time now.
func (e *engine) lookupInAnswer(k driver.Key, rec driver.Record, now time.Time) (driver.Record, bool, time.Time, error) {
	rec.Key = k
	e.fill(&rec)
	if !now.Before(rec.ExpiresAt) { // exact at read time: past retention is absent
		return driver.Record{}, false, now, nil
	}
	return rec, true, now, nil
}

// lookupInSQL is the statement of lookupIn for epoch's partition (its text names the
// partition; the few texts in use are kept, at most 64).
func (e *engine) lookupInSQL(epoch int64) string {
	return e.lookupInText.get(epoch, func() string { return e.q.lookupIn(partName(famRecords, epoch)) })
}
