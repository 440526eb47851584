package pgstore

import (
	"context"
	"sync"
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
// Reads of different keys that arrive together are sent as one statement (replay.go).
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
	err := queryRecord(ctx, e.pool, e.lookupInSQL(epoch), []any{[]byte(k.Scope), []byte(k.ID), arg}, &rec, &now)
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
	return e.lookupInText.get(epoch, func() string { return e.q.lookupIn(partName(famRecords, aimed(epoch))) })
}

// hintCap bounds one generation of the finished-key hint: at most 2×hintCap key hashes are
// remembered (16 bytes each and the record's epoch, 8, plus the map's overhead: about 2.5 MiB
// in all).
const hintCap = 1 << 14

// finishedHint remembers the keys this engine recently saw finished (its own Finish and
// DoTx commits, and the replays it answered). It only picks the first statement of a claim,
// never its answer:
//   - a key in the hint is probably a retry of a finished operation, so Claim tries the
//     replay fast path first (one plain read, no lock: replay.go);
//   - any other key is probably new, so Claim goes straight to the claim batch, whose fresh
//     statement also returns the key's record if it has one (claim.go): a first call
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

// Reads of the replay fast path that arrive together share a statement (combiner.go): the
// reads of keys the hint places in the same partition as the sender's are one statement over
// arrays of keys (queries.lookupManyIn), one snapshot and one clock for all of them, each
// key's row being what its own lookupIn would read at that time. A key whose row is not
// there, a key of another partition, and every key of a batch that failed, read alone
// (lookupInAlone, which falls back to the parent's read as before).

// lookupV is one fast-path read's arguments and answer in the lookup combiner.
type lookupV struct {
	epoch int64

	rec   driver.Record
	found bool
	now   time.Time
	err   error
	done  bool // rec, found, now and err are lookupIn's answer; else the key reads alone
}

type lookupCall = batchCall[lookupV]

// newLookupCombiner is the engine's combiner of fast-path reads.
func (e *engine) newLookupCombiner() *combiner[lookupV] {
	return &combiner[lookupV]{send: func(ctx context.Context, self *lookupCall, batch []*lookupCall) {
		if in := samePartition(self, batch, func(v *lookupV) int64 { return v.epoch }); len(in) > 1 {
			e.lookupMany(ctx, self, in)
			return
		}
		v := &self.v
		v.rec, v.found, v.now, v.err = e.lookupInAlone(ctx, self.key, v.epoch)
		v.done = true
	}}
}

// lookupMany reads the keys of in (the sender's among them), all placed in the sender's
// partition, in one statement.
func (e *engine) lookupMany(ctx context.Context, self *lookupCall, in []*lookupCall) {
	ep := self.v.epoch
	n := len(in)
	scopes, ids := make([][]byte, n), make([][]byte, n)
	for i, c := range in {
		scopes[i], ids[i] = []byte(c.key.Scope), []byte(c.key.ID)
	}
	sql := e.lookupManyText.get(ep, func() string { return e.q.lookupManyIn(partName(famRecords, aimed(ep))) })
	arg := e.nowArg()
	rows, err := e.pool.Query(ctx, sql, scopes, ids, arg)
	if err != nil {
		e.batchFailures.Add(1)
		return // each key reads alone
	}
	type read struct {
		rec driver.Record
		now time.Time
	}
	got := make([]*read, n)
	for rows.Next() {
		r := &read{}
		var i int64
		err = scanRow(rows, &r.rec, &r.now, &i)
		i = member(i, n)
		if err == errAbsent { // no row of that key in the partition: it reads alone
			err = nil
			continue
		}
		if err != nil {
			break
		}
		if i < 1 || i > int64(n) || got[i-1] != nil {
			err = errorf("pgstore: lookup batch: row for key %d of %d", i, n)
			break
		}
		got[i-1] = r
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil || (e.testLoseBatch != nil && e.testLoseBatch()) {
		e.batchFailures.Add(1)
		return
	}
	for i, c := range in {
		if r := got[i]; r != nil {
			now := e.saw(r.now, arg)
			e.lookupInHits.Add(1)
			v := &c.v
			v.rec, v.found, v.now, v.err = e.lookupInAnswer(c.key, r.rec, now)
			v.done = true
		}
	}
}
