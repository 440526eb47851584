package pgstore

import (
	"context"
	"errors"
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
func (e *engine) claimFresh(ctx context.Context, conn querier, req driver.ClaimRequest, nonce []byte) (row claimRow, ok bool, err error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(e.q.lock, lockClass, lockID(keyHash(req.Key)))
	now := e.nowArg()
	b.Queue(e.q.fresh, []byte(req.Key.Scope), []byte(req.Key.ID), req.Fingerprint, nonce,
		req.LeaseTTL.Microseconds(), e.retentionUS(), e.width, e.oldest(), now)
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
