package pgstore

import (
	"bytes"
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// Steps (receipts.Lease.Step): a claim's step journal is its record's journal column
// (driver.Journals). Every other write of the record leaves the column as it is (Renew,
// Finish, Abandon, a takeover); Release of a claim that has a journal keeps it, abandoned (the
// root asks for it); Forget, GC and erasure delete it with the row. Lookup reads it with the
// record; a takeover (Claim, TakeOver) reads it after its claim, by the new token.

// errStepsInDoTx: DoTx's transaction commits once, at its end, so a step in it could not be
// durable before it returns.
var errStepsInDoTx = errors.New("pgstore: steps in DoTx: its transaction commits once, at its end, so a step's record could not be durable before the step returns; use Do (or Claim and Run), with Step.Stage for the step's own writes")

// Journal implements driver.Journals: one fenced UPDATE, committed before it returns; with an
// effect, the effect's writes and the UPDATE in one transaction.
func (e *engine) Journal(ctx context.Context, k driver.Key, token uint64, journal []byte,
	effect func(ctx context.Context, tx any) error,
) (rec driver.Record, err error) {
	if e.bound.get(token) != nil {
		return driver.Record{}, errStepsInDoTx
	}
	if !e.unCancelled(ctx, func(ctx context.Context) { rec, err = e.journal(ctx, k, token, journal, effect) }) {
		return driver.Record{}, errorf("pgstore: journal: %w", ctx.Err())
	}
	return rec, err
}

func (e *engine) journal(ctx context.Context, k driver.Key, token uint64, journal []byte,
	effect func(ctx context.Context, tx any) error,
) (driver.Record, error) {
	args := e.fencedArgs(k, token, journal)
	if effect == nil {
		written := func(r driver.Record) bool { // a write whose reply was lost, read back
			return r.Token == token && r.State == driver.Pending && bytes.Equal(r.Journal, journal)
		}
		rec, _, err := e.write(ctx, e.pool, "journal", e.q.journal, k, args, written)
		if err == nil {
			e.leases.put(token, e.epochOf(rec.UpdatedAt)) // the row moved to the write's epoch
			rec.Journal = journal
		}
		return rec, err
	}
	c, err := e.pool.Acquire(ctx)
	if err != nil {
		return driver.Record{}, errorf("pgstore: journal with effects: %w", err)
	}
	t := &txConn{c: c}
	defer t.end(ctx) // rolls back unless committed
	if t.tx, err = c.Begin(ctx); err != nil {
		return driver.Record{}, errorf("pgstore: journal with effects: %w", err)
	}
	if err := e.fenceTx(ctx, t.tx, k, token); err != nil {
		return driver.Record{}, err
	}
	if err := t.checkEffect(effect(ctx, t.fnTx())); err != nil {
		return driver.Record{}, err
	}
	rec, _, err := e.write(ctx, t.tx, "journal", e.q.journal, k, args, nil)
	if err != nil {
		return driver.Record{}, err
	}
	if err := e.checkedCommit(c.Conn().PgConn(), func() error { return t.tx.Commit(ctx) }); err != nil {
		return driver.Record{}, errorf("pgstore: journal with effects: commit: %w", err)
	}
	e.leases.put(token, e.epochOf(rec.UpdatedAt))
	rec.Journal = journal
	return rec, nil
}

// journalOf reads the journal of k's record held by token (after a takeover), nil if none.
func (e *engine) journalOf(ctx context.Context, k driver.Key, token uint64) ([]byte, error) {
	var j []byte
	err := e.pool.QueryRow(ctx, e.q.journalOf, []byte(k.Scope), []byte(k.ID), e.oldest(), int64(token)).Scan(&j)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, errorf("pgstore: read the step journal: %w", err)
	}
	return j, nil
}
