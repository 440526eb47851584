package pebbleengine

import (
	"context"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// Claim decides a claim of req.Key:
//
//  1. the replay cache (fromCache): a retry of a finished operation is
//     answered with one engine read checked against the cached record,
//     without the key lock;
//  2. otherwise rmw under the key lock: machine.Claim decides from the
//     visible record; a new or taken-over claim gets a fresh token and is
//     written to the current epoch, synced unless it guards an unbound Unit (WithUnit). A key with
//     no visible record whose tombstone is in force answers Expired.
func (e *Engine) Claim(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	k := req.Key
	var lk [keys.MaxLockKeyLen]byte
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	if res, ok := e.fromCache(ctx, k, lockKey, req.Fingerprint, e.now()); ok {
		return res, nil
	}
	var tomb tombOut
	var erased erasedSpan
	sc := scratch() // the claim's record is built in sc.next, read into res below
	defer sc.release()
	wo := writeOpts{noSync: claimUnsynced(ctx), claim: true, tomb: &tomb, erased: &erased}
	var mres machine.ClaimResult
	var seen encoding.Record // the visible record, when nothing is written
	next, now, err := e.rmw(ctx, k, lockKey, nil, wo, sc, func(cur *encoding.Record, now int64) (*encoding.Record, bool, error) {
		var err error
		// The claim's fingerprint is the request's (not a copy): encoded by
		// rmw, and the record's in the answer, which the caller handed in.
		mres, err = machine.ClaimInto(&sc.next, cur, req.Fingerprint, now, int64(req.LeaseTTL), e.tokenFn)
		if err != nil {
			return nil, false, err
		}
		if mres.Outcome != machine.Claimed && cur != nil {
			seen = *cur
		}
		return mres.Next, false, nil
	})
	if err != nil {
		return driver.ClaimResult{}, err
	}
	res := driver.ClaimResult{Now: e.time(now)}
	if erased.until != 0 {
		res.Outcome, res.Record = driver.Erased, driver.Record{Key: k, UpdatedAt: e.time(erased.at), ExpiresAt: e.time(erased.until)}
		return res, nil
	}
	if tomb.ok {
		t := e.tombstoneOf(k, tomb.usedAt)
		res.Outcome, res.Record = driver.Expired, driver.Record{Key: k, UpdatedAt: t.UsedAt, ExpiresAt: t.ExpiredAt}
		return res, nil
	}
	switch mres.Outcome {
	case machine.Claimed:
		res.Outcome, res.Record = driver.Claimed, e.record(k, next)
		if mres.Recovered {
			res.Outcome = driver.TookOver
		}
	case machine.Replay:
		res.Outcome, res.Record = driver.Replay, e.record(k, &seen)
	case machine.Mismatch:
		res.Outcome, res.Record = driver.Mismatch, driver.Record{Key: k}
	default:
		res.Outcome, res.Record = driver.InProgress, e.record(k, &seen)
	}
	return res, nil
}
