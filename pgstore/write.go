package pgstore

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/receiptstore/receipts/driver"
)

// errBadState: Finish takes Succeeded or Failed only.
var errBadState = errors.New("pgstore: finish state must be Succeeded or Failed")

func (e *engine) fencedArgs(k driver.Key, token uint64, extra ...any) []any {
	return append([]any{[]byte(k.Scope), []byte(k.ID), int64(token), e.oldest(), e.retentionUS(), e.width, e.nowArg()}, extra...)
}

// write runs a fenced UPDATE that returns the record, retrying serialization failures (a
// concurrent writer moved the row to another partition: the retry then finds the row by its
// token, or finds it gone) and, outside a transaction, broken connections. No row:
// driver.ErrLeaseLost, unless an earlier attempt lost its reply and verify (if set) finds that
// it had been applied.
func (e *engine) write(ctx context.Context, q querier, op, sql string, k driver.Key, args []any, verify func(driver.Record) bool) (driver.Record, string, error) {
	_, inTx := q.(pgx.Tx)
	lost := false
	for attempt := 0; ; attempt++ {
		var rec driver.Record
		var now time.Time
		var xid string
		var err error
		if inTx {
			err = scanRecord(q.QueryRow(ctx, sql, args...), &rec, &now, &xid)
		} else { // the statement commits on its own
			err = e.commitRow(ctx, sql, args, func(r pgx.Row) error { return scanRecord(r, &rec, &now, &xid) })
		}
		if err == nil && !inTx && e.testLoseReply != nil {
			err = e.testLoseReply()
		}
		if err == nil {
			rec.Key = k
			e.fill(&rec)
			e.saw(now, nil)
			return rec, xid, nil
		}
		if errors.Is(err, pgx.ErrNoRows) {
			if lost && verify != nil {
				if cur, found, _, lerr := e.Lookup(ctx, k); lerr == nil && found && verify(cur) {
					if derr := e.confirmDurable(ctx); derr != nil { // it may be on the primary only
						return driver.Record{}, "", errorf("pgstore: %s: the reply was lost; it landed, but %w", op, derr)
					}
					return cur, "", nil
				}
			}
			return driver.Record{}, "", errorf("pgstore: %s: %w", op, driver.ErrLeaseLost)
		}
		switch {
		case inTx || attempt >= maxOther:
		case retryable(err):
			continue
		case noPartition(err):
			if err := e.ensureCurrent(ctx); err != nil {
				return driver.Record{}, "", err
			}
			continue
		case lostReply(ctx, err):
			lost = lost || !pgconn.SafeToRetry(err)
			if sleep(ctx, 10*time.Millisecond<<min(attempt, 5)) == nil {
				continue
			}
		}
		return driver.Record{}, "", errorf("pgstore: %s: %w", op, err)
	}
}

// commitRow runs sql, a statement that commits on its own, on one of the pool's connections,
// and scans its row with scan; the COMMIT goes through checkedCommit.
func (e *engine) commitRow(ctx context.Context, sql string, args []any, scan func(pgx.Row) error) error {
	c, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return e.checkedCommit(c.Conn().PgConn(), func() error { return scan(c.QueryRow(ctx, sql, args...)) })
}

// finished reports whether rec is the outcome a lost Finish of token would have written.
func finished(token uint64, state driver.State, result []byte) func(driver.Record) bool {
	return func(r driver.Record) bool {
		return r.Token == token && r.State == state && bytes.Equal(r.Result, result)
	}
}

// The engine's writes run uncancelled (unCancelled): a caller whose context ends while one is
// in flight gets its context's error at once, and the write goes on, so neither pgx's deadline
// nor its cancel request reaches its COMMIT (detach.go, syncrep.go).

// Renew implements driver.Engine.
func (e *engine) Renew(ctx context.Context, k driver.Key, token uint64, ttl time.Duration) (rec driver.Record, err error) {
	if !e.unCancelled(ctx, func(ctx context.Context) { rec, err = e.renew(ctx, k, token, ttl) }) {
		return driver.Record{}, errorf("pgstore: renew: %w", ctx.Err())
	}
	return rec, err
}

func (e *engine) renew(ctx context.Context, k driver.Key, token uint64, ttl time.Duration) (driver.Record, error) {
	if e.bound.get(token) != nil { // DoTx's transaction holds the row: nobody can take it over
		return driver.Record{}, nil
	}
	rec, _, err := e.write(ctx, e.pool, "renew", e.q.renew, k, e.fencedArgs(k, token, ttl.Microseconds()), nil)
	if err == nil {
		e.leases.put(token, e.epochOf(rec.UpdatedAt)) // the row moved to the renewal's epoch
	} else if errors.Is(err, driver.ErrLeaseLost) {
		e.leases.drop(token)
	}
	return rec, err
}

// Finish implements driver.Engine: one statement, committed before it returns.
func (e *engine) Finish(ctx context.Context, k driver.Key, token uint64, state driver.State, result []byte) (rec driver.Record, err error) {
	if !e.unCancelled(ctx, func(ctx context.Context) { rec, err = e.finish(ctx, k, token, state, result) }) {
		return driver.Record{}, errorf("pgstore: finish: %w", ctx.Err())
	}
	return rec, err
}

func (e *engine) finish(ctx context.Context, k driver.Key, token uint64, state driver.State, result []byte) (driver.Record, error) {
	if state != driver.Succeeded && state != driver.Failed {
		return driver.Record{}, errBadState
	}
	if t := e.bound.get(token); t != nil {
		return e.finishBound(ctx, t, k, token, state, result, nil)
	}
	if result == nil {
		result = []byte{}
	}
	trace := driver.TraceOf(ctx)
	args := e.fencedArgs(k, token, int16(state), result, trace)
	verify := finished(token, state, result)
	ep, aimed := e.finishIn(token)
	if aimed {
		var rec driver.Record
		var done bool
		var err error
		if e.testNoBatch {
			rec, done, err = e.finishAimedAt(ctx, k, ep, token, state, result, trace)
		} else { // alone, or in a batch with other finishes aimed at the same partition
			c := &finishCall{ctx: ctx, key: k, v: finishV{ep: ep, token: token, state: state, result: result, trace: trace}}
			if !e.finishes.do(c) {
				return driver.Record{}, errorf("pgstore: finish: %w", ctx.Err())
			}
			rec, done, err = c.v.rec, c.v.done, c.v.err
		}
		if done {
			if err == nil {
				e.wakeFinished(k, rec)
			}
			return rec, err
		}
	}
	// The parent's statement finds the row wherever it is, or reports the lease lost. If the
	// aimed statement was tried, it may have applied before its reply was lost: the outcome
	// it wrote is then recognised.
	rec, _, err := e.write(ctx, e.pool, "finish", e.q.finish, k, args, verify)
	if aimed && errors.Is(err, driver.ErrLeaseLost) {
		if cur, found, _, lerr := e.Lookup(ctx, k); lerr == nil && found && verify(cur) {
			rec, err = cur, nil
			if derr := e.confirmDurable(ctx); derr != nil { // it may be on the primary only
				rec, err = driver.Record{}, errorf("pgstore: finish: the reply was lost; it landed, but %w", derr)
			}
		}
	}
	if err == nil {
		e.wakeFinished(k, rec)
	}
	return rec, err
}

// Abandon implements driver.Engine.
func (e *engine) Abandon(ctx context.Context, k driver.Key, token uint64) (err error) {
	if !e.unCancelled(ctx, func(ctx context.Context) { err = e.abandon(ctx, k, token) }) {
		return errorf("pgstore: abandon: %w", ctx.Err())
	}
	return err
}

func (e *engine) abandon(ctx context.Context, k driver.Key, token uint64) error {
	if t := e.bound.get(token); t != nil {
		return e.abandonBound(ctx, t, k, token)
	}
	e.leases.drop(token)
	_, _, err := e.write(ctx, e.pool, "abandon", e.q.abandon, k, e.fencedArgs(k, token), nil)
	if err == nil {
		e.wake(k)
	}
	return err
}

// Release implements driver.Engine: a lease that never took over deletes the record; a
// recovered one keeps it as an abandoned claim (the earlier attempt's outcome is still
// unknown, so the next claim must be Recovered too).
func (e *engine) Release(ctx context.Context, k driver.Key, token uint64, recovered bool) (err error) {
	if !e.unCancelled(ctx, func(ctx context.Context) { err = e.release(ctx, k, token, recovered) }) {
		return errorf("pgstore: release: %w", ctx.Err())
	}
	return err
}

func (e *engine) release(ctx context.Context, k driver.Key, token uint64, recovered bool) error {
	if t := e.bound.get(token); t != nil {
		e.releaseBound(ctx, t, k, token)
		return nil
	}
	e.leases.drop(token)
	if recovered {
		_, _, err := e.write(ctx, e.pool, "release", e.q.abandon, k, e.fencedArgs(k, token), nil)
		if err == nil {
			e.wake(k)
		}
		return err
	}
	return e.delete(ctx, "release", k, token)
}

// Forget implements driver.Engine.
func (e *engine) Forget(ctx context.Context, k driver.Key, token uint64) (err error) {
	if e.bound.get(token) != nil {
		return errBoundForget
	}
	e.leases.drop(token)
	if !e.unCancelled(ctx, func(ctx context.Context) { err = e.delete(ctx, "forget", k, token) }) {
		return errorf("pgstore: forget: %w", ctx.Err())
	}
	return err
}

func (e *engine) delete(ctx context.Context, op string, k driver.Key, token uint64) error {
	lost := false
	for attempt := 0; ; attempt++ {
		var now time.Time
		args := e.fencedArgs(k, token)
		if e.q.tombs {
			args = append(args, e.markerBottom()) // its markers go too
		}
		err := e.commitRow(ctx, e.q.del, args, func(r pgx.Row) error { return r.Scan(&now) })
		if err == nil && e.testLoseReply != nil {
			err = e.testLoseReply()
		}
		switch {
		case err == nil:
			e.saw(now, nil)
			e.wake(k)
			return nil
		case errors.Is(err, pgx.ErrNoRows):
			if lost { // an earlier attempt may have deleted it
				if _, found, _, lerr := e.Lookup(ctx, k); lerr == nil && !found {
					e.wake(k)
					return nil
				}
			}
			return errorf("pgstore: %s: %w", op, driver.ErrLeaseLost)
		case attempt < maxOther && retryable(err):
			continue
		case attempt < maxOther && lostReply(ctx, err):
			lost = lost || !pgconn.SafeToRetry(err)
			if sleep(ctx, 10*time.Millisecond<<min(attempt, 5)) != nil {
				return errorf("pgstore: %s: %w", op, err)
			}
		default:
			return errorf("pgstore: %s: %w", op, err)
		}
	}
}

// finishTx records Succeeded or Failed inside the caller's transaction: the receipt commits
// iff tx commits. If tx rolls back, nothing is recorded and the lease is still held. Waiters
// (here and on other nodes) are woken once the engine sees tx committed (it watches the
// transaction id; no NOTIFY runs inside tx). A serialization failure (the row was moved by a
// concurrent renew at an epoch boundary, or taken over) is returned as is: the caller rolls
// back and retries its transaction; fenceTx at the start of tx rules it out.
func (e *engine) finishTx(ctx context.Context, tx pgx.Tx, k driver.Key, token uint64, state driver.State, result []byte) (driver.Record, error) {
	if state != driver.Succeeded && state != driver.Failed {
		return driver.Record{}, errBadState
	}
	if result == nil {
		result = []byte{}
	}
	e.leases.drop(token)
	rec, xid, err := e.write(ctx, tx, "commit", e.q.finish, k, e.fencedArgs(k, token, int16(state), result, driver.TraceOf(ctx)), nil)
	if err == nil {
		e.notifier.afterCommit(xid, keyHash(k))
	}
	return rec, err
}

// fenceTx locks the holder's row inside the caller's transaction (SELECT … FOR UPDATE), before
// the caller does its effect: no row means the lease is lost (driver.ErrLeaseLost; roll back).
// While tx holds the row nobody can take the lease over (a concurrent claim skips the locked
// row and reports it in progress), so the effect and finishTx in tx are safe from takeover.
// Renewals of this lease block until tx ends: the caller should stop renewing first.
func (e *engine) fenceTx(ctx context.Context, tx pgx.Tx, k driver.Key, token uint64) error {
	var now time.Time
	err := tx.QueryRow(ctx, e.q.fence, e.fencedArgs(k, token)...).Scan(&now)
	switch {
	case err == nil:
		e.saw(now, nil)
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return errorf("pgstore: fence: %w", driver.ErrLeaseLost)
	default:
		return errorf("pgstore: fence: %w", err)
	}
}
