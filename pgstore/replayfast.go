package pgstore

import (
	"context"

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
func (e *engine) replayFast(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, bool) {
	if e.closing() || e.testNoReplayFast {
		return driver.ClaimResult{}, false
	}
	rec, found, now, err := e.Lookup(ctx, req.Key)
	if err != nil || !found || (rec.State != driver.Succeeded && rec.State != driver.Failed) {
		return driver.ClaimResult{}, false
	}
	e.replayFastHits.Add(1)
	e.hint.add(keyHash(req.Key))
	res := driver.ClaimResult{Outcome: driver.Replay, Record: rec, Now: now}
	if string(rec.Fingerprint) != string(req.Fingerprint) {
		res.Outcome = driver.Mismatch
	}
	return res, true
}
