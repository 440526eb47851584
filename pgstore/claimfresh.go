package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// What claimFresh's statement found.
type freshGot int

const (
	freshNone     freshGot = iota // no row back: a tombstone in force (a conflicting insert fails: uniqueViolation)
	freshClaimed                  // the key had no record and is claimed (row holds the claim)
	freshExisting                 // the key has a record (row.rec, row.now: as the lookup reads it)
)

// claimFresh opens a gated claim's transaction on conn with [BEGIN; fresh] in one
// batch (one round trip): under the key's advisory lock, a key with no record in the live
// partitions is claimed by a plain INSERT, without the claim statement's other branches
// (their partition probes, row lock and UPDATE cost server CPU on every first call). A key
// that has a record gets it back (freshExisting), read on a snapshot taken after the lock,
// with the statement's time. Unless the answer is freshClaimed the transaction is still open
// and the lock held: the caller then sends the claim statement in the same transaction, which
// decides as before (the lock is re-entrant), or answers a finished record itself
// (replayable). The decision is the claim statement's "fresh" branch on a snapshot taken
// after the lock, so it is the one the claim statement would have made.
//
// With commit, the fresh statement is sent alone and commits by itself (a first
// call's claim, or a retry's answer, in one round trip), and the transaction is over when
// claimFresh returns, with or without a claim: the caller reads the closing gate after the
// claim is committed and undoes it (undoFresh) if Close began meanwhile.
func (e *engine) claimFresh(ctx context.Context, conn querier, req driver.ClaimRequest, nonce []byte, commit bool) (row claimRow, got freshGot, err error) {
	tail := ""
	if commit {
		tail = "COMMIT"
	}
	row, got, _, err = e.sendFresh(ctx, conn, req, nonce, false, tail)
	return row, got, err
}

// sendFresh is claimFresh with the batch's last statement given: tail ("COMMIT", DoTx's
// "SAVEPOINT …", or none). The statement is q.freshFn (freshFnSQL): the key's lock, the
// scope's check and the fresh decision in one. With tail "COMMIT" it is sent alone and commits
// by itself (one statement, its implicit transaction: the locks end with it); otherwise the
// batch is [BEGIN; freshFn; tail]. With wantTx the transaction it begins is pgx's
// (Batch.BeginTx) and returned, for DoTx's fn: conn must then be a connection (a pool's batch
// that begins a transaction keeps its connection until the transaction ends).
func (e *engine) sendFresh(ctx context.Context, conn querier, req driver.ClaimRequest, nonce []byte, wantTx bool, tail string) (row claimRow, got freshGot, tx pgx.Tx, err error) {
	b := &pgx.Batch{}
	autocommit := tail == "COMMIT" && !wantTx
	switch {
	case wantTx:
		b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	case !autocommit:
		b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	}
	now := e.nowArg()
	b.Queue(e.q.freshFn, e.freshArgs(req, nonce, now)...)
	if tail != "" && !autocommit {
		b.Queue(tail)
	}
	br := conn.SendBatch(ctx, b)
	tx = br.Tx()
	if !autocommit {
		_, err = br.Exec() // BEGIN
	}
	if err == nil {
		var claimed bool
		err = scanRecord(br.QueryRow(), &row.rec, &row.now, &claimed)
		switch {
		case err == nil && claimed:
			got = freshClaimed
		case err == nil:
			got = freshExisting
		case errors.Is(err, pgx.ErrNoRows):
			err = nil
		}
	}
	if tail != "" && !autocommit && err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil || got == freshNone {
		return claimRow{}, freshNone, tx, err
	}
	row.rec.Key = req.Key
	e.fill(&row.rec)
	if got == freshClaimed {
		row.outcome = "claimed"
		row.now = e.saw(row.rec.CreatedAt, now)
	} else {
		row.now = e.saw(row.now, now)
	}
	return row, got, tx, nil
}

// freshArgs are q.freshFn's parameters (freshFnSQL) for a first claim of req at now (nowArg).
func (e *engine) freshArgs(req driver.ClaimRequest, nonce []byte, now any) []any {
	id := driver.ScopeID(e.secret, req.Key.Scope)
	var mbottom, rbottom any // NULL: tombstones off
	if e.q.tombs {
		mb := e.markerBottom()
		mbottom, rbottom = mb, mb*(e.mwidth/e.width) // recordBottom
	}
	return []any{lockID(keyHash(req.Key)), scopeLock(id), id, []byte(req.Key.Scope), []byte(req.Key.ID),
		req.Fingerprint, nonce, req.LeaseTTL.Microseconds(), e.width, e.oldest(), now, e.q.injected,
		mbottom, rbottom, e.tombUS()}
}

// replayable is the answer to a claim whose fresh statement found a finished record that is
// still visible at the statement's time: what the claim statement would answer on that
// snapshot ("done", or "mismatch" for another fingerprint), as replayFast reasons. ok is
// false for anything else (Pending, past retention), which the claim statement decides.
func replayable(req driver.ClaimRequest, row claimRow) (claimRow, bool) {
	r := &row.rec
	if (r.State != driver.Succeeded && r.State != driver.Failed) || !row.now.Before(r.ExpiresAt) {
		return claimRow{}, false
	}
	row.outcome = "done"
	if string(r.Fingerprint) != string(req.Fingerprint) {
		row.outcome = "mismatch"
	}
	return row, true
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
