package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Claim implements driver.Engine: a retry of a key this engine recently saw finished (the
// hint: hint.go) is answered from one plain read (replayFast); otherwise claimDecide decides
// (its first batch answers a first call and a retry of a finished record alike, in one round
// trip), and a lease whose grant came back late is renewed before it is handed out.
//
// A lease runs from the moment the claim statement decided, by the database's clock. The
// reply can come back much later: a reply lost to a cut connection is found again by the
// retry (the nonce), a restarting server answers late. The caller may start an external
// effect as soon as Claim returns, so it must not get a lease that is nearly over: if the
// claim took more than a third of the lease, Claim renews it first (a fenced write, so it
// fails if another caller took the key over meanwhile; the key is then claimed afresh).
func (e *engine) Claim(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	res, err := e.claim(ctx, req)
	if err == nil && res.Outcome == driver.TookOver { // the steps it resumes (steps.go)
		if res.Record.Journal, err = e.journalOf(ctx, req.Key, res.Record.Token); err != nil {
			// Nobody holds the claim (no effect ran under it): abandoned again, as it was.
			e.settleLater(ctx, func(sctx context.Context) { e.undoClaim(sctx, req.Key, res.Record.Token, true) })
			return driver.ClaimResult{}, err
		}
	}
	return res, err
}

// claim is Claim without the journal of a takeover.
func (e *engine) claim(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	if err := e.requireSyncStandby(); err != nil {
		return driver.ClaimResult{}, errorf("pgstore: claim: %w", err)
	}
	if ep, seen := e.hint.get(keyHash(req.Key)); seen { // else probably a first call: the claim batch, no read before it
		if res, ok := e.replayFast(ctx, req, ep); ok { // a finished record: one plain read (replayfast.go)
			return res, nil
		}
	}
	start := time.Now()
	res, err := e.claimDecide(ctx, req)
	if err != nil || (res.Outcome != driver.Claimed && res.Outcome != driver.TookOver) || time.Since(start) <= req.LeaseTTL/3 {
		return res, err
	}
	// Renewed once: a lease shorter than the database's round trip stays short whatever is
	// done, and is handed out as it is.
	rec, err := e.Renew(ctx, req.Key, res.Record.Token, req.LeaseTTL)
	switch {
	case err == nil:
		res.Record, res.Now = rec, rec.UpdatedAt
		return res, nil
	case errors.Is(err, driver.ErrLeaseLost): // it ran out and was taken over: start again
		return e.claimDecide(ctx, req)
	}
	// Nobody holds the claim (no effect ran under it): undone, the key as it was.
	e.settleLater(ctx, func(sctx context.Context) {
		e.undoClaim(sctx, req.Key, res.Record.Token, res.Outcome == driver.TookOver)
	})
	return driver.ClaimResult{}, errorf("pgstore: claim: renewing a lease granted late: %w", err)
}
