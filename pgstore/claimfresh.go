package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// claimFresh opens a gated claim's transaction on conn with [BEGIN; lock; fresh] in one
// batch (one round trip): under the key's advisory lock, a key with no record in the live
// partitions is claimed by a plain INSERT, without the claim statement's other branches
// (their partition probes, row lock and UPDATE cost server CPU on every first call). ok is
// false, with the transaction still open and the lock held, when the key has a record:
// the caller then sends the claim statement in the same transaction, which decides as
// before (the lock is re-entrant). The decision is the claim statement's "fresh" branch on
// a snapshot taken after the lock, so it is the one the claim statement would have made.
//
// With commit, COMMIT is the batch's last statement ([BEGIN; lock; fresh; COMMIT]: a first
// call's claim in one round trip), and the transaction is over when claimFresh returns, with
// or without a claim: the caller reads the closing gate after the claim is committed and
// undoes it (undoFresh) if Close began meanwhile.
func (e *engine) claimFresh(ctx context.Context, conn querier, req driver.ClaimRequest, nonce []byte, commit bool) (row claimRow, ok bool, err error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(e.q.lock, lockClass, lockID(keyHash(req.Key)))
	now := e.nowArg()
	b.Queue(e.q.fresh, e.claimArgs(req, nonce, now)...)
	if commit {
		b.Queue("COMMIT")
	}
	br := conn.SendBatch(ctx, b)
	if _, err = br.Exec(); err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		r := &row.rec
		var lease time.Time
		err = br.QueryRow().Scan(&r.Token, &r.Attempts, &r.CreatedAt, &r.UpdatedAt, &lease)
		r.LeaseExpiresAt = lease
		ok = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if commit && err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil || !ok {
		return claimRow{}, false, err
	}
	row.outcome = "claimed"
	row.rec.State = driver.Pending
	row.rec.Fingerprint = req.Fingerprint
	row.rec.Key = req.Key
	e.fill(&row.rec)
	row.now = e.saw(row.rec.CreatedAt, now)
	return row, true, nil
}

// undoFresh removes a claim a one-round-trip batch (claimFresh with commit) committed after
// the DB's Close began, so that nothing decided after Close began stays and no lease is handed
// out: the record is deleted by its token, as Release of a lease that never took over does
// (the key had no record, or only one past retention, before it). It runs even if ctx is
// done. An error is returned with driver.ErrClosed: the claim then stays Pending until its
// lease runs out, with no effect run under it.
func (e *engine) undoFresh(ctx context.Context, req driver.ClaimRequest, token uint64) error {
	err := e.delete(context.WithoutCancel(ctx), "claim: undo after close", req.Key, token)
	if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return fmt.Errorf("%w (%w)", driver.ErrClosed, err)
	}
	return driver.ErrClosed
}
