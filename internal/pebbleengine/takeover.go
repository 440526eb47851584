package pebbleengine

import (
	"context"
	"fmt"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

var _ driver.AttemptTaker = (*Engine)(nil)

// TakeOver implements driver.AttemptTaker: one rmw under the key lock that
// takes over the record only if it is still the attempt with token and its
// lease has run out.
func (e *Engine) TakeOver(ctx context.Context, req driver.ClaimRequest, token uint64) (driver.ClaimResult, error) {
	k := req.Key
	var lk [keys.MaxLockKeyLen]byte
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	var seen encoding.Record // the live attempt, when nothing is written
	live := false
	next, now, err := e.rmw(ctx, k, lockKey, nil, writeOpts{claim: true}, nil, func(cur *encoding.Record, now int64) (*encoding.Record, bool, error) {
		if cur == nil || cur.State != encoding.StatePending || cur.Token != token {
			return nil, false, fmt.Errorf("%w: the key is no longer the attempt with token %d", driver.ErrLeaseLost, token)
		}
		if machine.LeaseLive(cur, now) {
			seen, live = *cur, true
			return nil, false, nil
		}
		mres, err := machine.Claim(cur, cur.Fingerprint, now, int64(req.LeaseTTL), e.tokenFn)
		if err != nil {
			return nil, false, err
		}
		if mres.Outcome != machine.Claimed || !mres.Recovered {
			return nil, false, fmt.Errorf("receipts: take over: the state machine answered outcome %d", mres.Outcome)
		}
		return mres.Next, false, nil
	})
	if err != nil {
		return driver.ClaimResult{}, err
	}
	if live {
		return driver.ClaimResult{Outcome: driver.InProgress, Record: e.record(k, &seen), Now: e.time(now)}, nil
	}
	return driver.ClaimResult{Outcome: driver.TookOver, Record: e.record(k, next), Now: e.time(now)}, nil
}
