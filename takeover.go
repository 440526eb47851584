package receipts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/observe"
)

// TakeOver takes over exactly the abandoned claim r, as listed by
// Scan(Filter{Abandoned: true}) or Lookup, so that its outcome can be
// settled without waiting for a client's retry: it succeeds only if the
// stored record is still that attempt (Pending, with r's Token) and its
// lease has run out. No other attempt can come in between: a claim that
// took the key over since r was read, or a holder that finished it, makes
// TakeOver fail and change nothing.
//
// The lease it returns is Recovered, with one more Attempt and a new token,
// like any takeover. Check with the provider by ProviderKey whether the
// effect happened (under any attempt), then settle it: Commit the result
// (it happened), Fail (a definitive failure), Forget (no attempt's effect
// happened: the key is free), or Abandon (still unknown: it stays
// abandoned, for a later check). Renew it (KeepAlive) if the check may take
// longer than the lease. opts may give LeaseFor; waiting options are
// ignored: TakeOver never waits.
//
// Errors: ErrLeaseLost if the record is no longer that attempt (taken over
// since, finished, released, forgotten or past retention);
// *InProgressError (ErrInProgress) if it is that attempt but its lease is
// live again (its holder renewed it); ErrInvalidKey or ErrInvalidArgument
// for a nil r, a bad key or a zero Token; ErrInvalidOptions; ErrUnsupported
// on an engine that cannot take over one given attempt; ErrClosed; ErrCorrupt;
// the context's error.
func (db *DB) TakeOver(ctx context.Context, r *Receipt, opts ...ClaimOption) (*Lease, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	if !db.tracing(ctx) {
		l, err := db.takeOver(ctx, r, claimOptions(opts))
		if l != nil {
			db.logTakeover(ctx, l)
		}
		return l, err
	}
	ctx = db.begin(ctx, observe.ClaimEvent)
	start := time.Now()
	l, err := db.takeOver(ctx, r, claimOptions(opts))
	k := Key{}
	if r != nil {
		k = r.Key
	}
	db.observeClaim(ctx, k, start, &claimTrace{}, l, nil, err)
	return l, err
}

func (db *DB) takeOver(ctx context.Context, r *Receipt, cfg claimConfig) (*Lease, error) {
	if r == nil || r.Token == 0 {
		return nil, fmt.Errorf("%w: TakeOver needs a listed claim (a Receipt with its Token)", ErrInvalidArgument)
	}
	if err := r.Key.validate(); err != nil {
		return nil, err
	}
	ttl, err := db.leaseTTL(&cfg)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	at, ok := db.eng.(driver.AttemptTaker)
	if !ok {
		return nil, fmt.Errorf("%w: TakeOver on the %s engine", ErrUnsupported, db.eng.Name())
	}
	sk, err := db.storedKey(r.Key) // Options.HashKeys: a listed key is stored already
	if err != nil {
		return nil, err
	}
	req := driver.ClaimRequest{Key: sk, Fingerprint: r.Fingerprint, LeaseTTL: ttl}
	res, err := at.TakeOver(ctx, req, r.Token)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return nil, fmt.Errorf("receipts: take over %s (token %d): %w", db.keyName(r.Key), r.Token, err)
		}
		return nil, err
	}
	switch res.Outcome {
	case driver.TookOver:
		db.hot.Claims.Add(1)
		db.n.takeovers.Add(1)
		l := &Lease{db: db, key: r.Key, skey: sk, token: res.Record.Token, attempt: res.Record.Attempts, recovered: true, ttl: ttl, claimedAt: db.clock(), class: observe.OperationClass(ctx)}
		l.steps.raw = bytes.Clone(res.Record.Journal)
		return l, nil
	case driver.InProgress:
		return nil, &InProgressError{Key: r.Key, RetryAfter: db.retryAfter(&res.Record, res.Now, observe.OperationClass(ctx)), db: db}
	}
	return nil, fmt.Errorf("receipts: take over %s: the %s engine answered outcome %d", db.keyName(r.Key), db.eng.Name(), res.Outcome)
}
