package pgstore

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// querier is a pool or a transaction.
type querier interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// claimRow is one answer of the claim statement.
type claimRow struct {
	outcome string
	rec     driver.Record
	now     time.Time
}

// Retry bounds of a claim. A claim retries by itself when its statement saw a conflicting row
// commit after its snapshot (no row back), when a takeable row was locked by a writer (busy),
// on serialization failures, on a missing partition, and when its reply was lost.
const (
	maxBusy      = 12 // busy retries (backoff 1 ms doubling to 16 ms: about 150 ms in all)
	maxLostReply = 8
	maxOther     = 20
)

// claimDecide is Claim after its replay fast path (see claim_late.go and replayfast.go): a
// first attempt sends the fresh statement (its own transaction: key lock, scope check and
// insert if absent in one statement, freshFnSQL) in one round trip and
// undoes a claim it committed if Close began meanwhile (claimGated's oneTrip); a key with a
// record, and every retry after a lost reply, runs
// [BEGIN; advisory lock; claim CTE] in one pgx batch (one
// round trip), then COMMIT (a second one) once the closing gate has been read, retried
// internally with the same nonce. The explicit transaction is what lets a claim that decided
// after the DB's Close began write nothing: Config.Closing is asked after the claim statement
// answered (the claim's time was taken, by the database or from the injected clock, before
// that) and before the claim is committed (made durable and visible); if Close has begun the
// transaction is rolled back and the claim answers ErrClosed.
func (e *engine) claimDecide(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	nonce := newNonce()
	var lastBusy claimRow
	busy, lost, other := 0, 0, 0
	// pids are the backends of the attempts whose reply was lost: their claim may have
	// landed. A later answer to the same nonce settles them (the claim statement finds what
	// landed: "own"); a caller who gives up first leaves them to resolveLost.
	var pids []uint32
	fail := func(err error) (driver.ClaimResult, error) {
		if lost > 0 {
			e.settleLater(ctx, func(context.Context) { e.resolveLost(ctx, req, nonce, pids...) })
		}
		return driver.ClaimResult{}, err
	}
	for {
		// No new lease once Close has begun. After a lost reply the earlier attempt may have
		// committed a claim decided before Close began: the retry finds it ("own") and hands
		// it out; a retry that decides afresh is refused by claimGated's own check.
		if lost == 0 && e.closing() {
			return driver.ClaimResult{}, errorf("pgstore: claim: %w", driver.ErrClosed)
		}
		row, err := e.claimGated(ctx, req, nonce, lost == 0)
		if err == nil && e.testLoseReply != nil {
			err = e.testLoseReply()
		}
		if err == nil && row.outcome == "own" && row.rec.Attempts == 1 && e.closing() {
			// A first claim an earlier attempt committed, maybe in one round trip (claimGated's
			// oneTrip) after Close began: undone, as that attempt would have undone it.
			return driver.ClaimResult{}, errorf("pgstore: claim %s: %w", req.Key, e.undoFresh(ctx, req, row.rec.Token))
		}
		if err == nil && row.outcome == "own" {
			// Our claim, which an attempt whose reply was lost committed: a session sees it
			// even if the primary made it alone (its wait for the standby cancelled), so it is
			// handed out only once confirmed, else undone.
			if derr := e.confirmDurable(ctx); derr != nil {
				token, tookOver := row.rec.Token, row.rec.Attempts > 1
				e.settleLater(ctx, func(ctx context.Context) { e.undoClaim(ctx, req.Key, token, tookOver) })
				return driver.ClaimResult{}, errorf("pgstore: claim: its reply was lost; it landed, but %w", derr)
			}
		}
		if err == nil && row.outcome != "busy" {
			return e.claimResult(req, row)
		}
		if mayHaveLanded(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			// a lost reply (not a caller who left: the send settles that itself)
			pids = append(pids, sentTo(err))
			lost++
		}
		switch {
		case errors.Is(err, driver.ErrClosed):
			return fail(errorf("pgstore: claim: %w", err))
		case erasedCode(err): // the scope's check: an erasure in force (erase.go)
			res, eerr := e.erasedClaim(ctx, req)
			if eerr != nil {
				return fail(eerr)
			}
			if _, ferr := fail(nil); ferr != nil { // settles the attempts whose reply was lost
				return driver.ClaimResult{}, ferr
			}
			return res, nil
		case err == nil: // busy
			lastBusy = row
			if busy++; busy > maxBusy {
				return driver.ClaimResult{Outcome: driver.InProgress, Record: lastBusy.rec, Now: lastBusy.now}, nil
			}
			if err := sleep(ctx, time.Millisecond<<min(busy-1, 4)); err != nil {
				return fail(err)
			}
		case lostReply(ctx, err):
			if lost > maxLostReply {
				return fail(errorf("pgstore: claim: %w", err))
			}
			if err := sleep(ctx, 10*time.Millisecond<<min(lost-1, 5)); err != nil {
				return fail(err)
			}
		case errors.Is(err, pgx.ErrNoRows) || retryable(err) || uniqueViolation(err):
			if other++; other > maxOther {
				return fail(errorf("pgstore: claim: %w", err))
			}
		case noPartition(err):
			if other++; other > maxOther {
				return fail(errorf("pgstore: claim: %w", err))
			}
			if err := e.ensureCurrent(ctx); err != nil {
				return fail(err)
			}
		default:
			return fail(errorf("pgstore: claim: %w", err))
		}
	}
}

// granted reports whether a claim statement's outcome wrote a new claim (one this attempt
// decided, as opposed to "own": a claim an earlier attempt decided and committed).
func granted(outcome string) bool { return outcome == "claimed" || outcome == "took_over" }

// claimGated runs one claim in an explicit transaction on a connection of its own: the batch
// [BEGIN; fresh] (claimFresh: lock, scope check, insert if absent), and only if the key has a
// record [claim]
// in the same transaction, then, if the statement granted a claim, COMMIT unless the DB's Close
// has begun (then ROLLBACK and driver.ErrClosed: nothing is written). Any other outcome wrote
// nothing and is rolled back. A lost COMMIT reply is a lost reply like any other (the retry's
// nonce finds the claim if it landed). The transaction runs detached from ctx (claimInTx in
// detachCall): if ctx ends first, claimGated returns its error at once, and the transaction
// rolls back, or, if its COMMIT was sent, the claim is undone once committed (detach.go).
//
// A finished record the fresh statement returns, still visible at its time, is answered
// from that read (replayable: what the claim statement would answer), without the claim
// statement.
//
// With oneTrip, the fresh statement runs in a transaction of its own (autocommit:
// a first call's claim, or a retry's answer, in one round trip; freshOneTrip, which sends it
// alone or in one transaction with other first claims). A claim it granted is committed before the closing
// gate is read, so if Close has begun by then the claim is undone (undoFresh: deleted by its
// token) and the answer is driver.ErrClosed: still no lease handed out after Close began, and
// nothing decided after Close began stays. If the key had a record, that batch committed
// nothing and the claim statement decides in a second transaction, gated as above.
func (e *engine) claimGated(ctx context.Context, req driver.ClaimRequest, nonce []byte, oneTrip bool) (claimRow, error) {
	if oneTrip {
		row, got, err := e.freshOneTrip(ctx, req, nonce) // the fresh statement, its own transaction, maybe with other keys
		if err != nil {
			return claimRow{}, err
		}
		switch got {
		case freshClaimed:
			if e.closing() { // committed, but decided after Close began, or handed out after it
				return claimRow{}, e.undoFresh(ctx, req, row.rec.Token)
			}
			return row, nil
		case freshExisting:
			if done, ok := replayable(req, row); ok { // a retry answered by the same round trip
				return done, nil
			}
		}
	}
	var row claimRow
	var err error
	var committed bool
	if !e.detachCall(ctx, func(ctx context.Context, gone func() bool) {
		row, committed, err = e.claimInTx(ctx, req, nonce, gone)
	}, func() {
		switch {
		case committed:
			e.undoClaim(ctx, req.Key, row.rec.Token, row.outcome == "took_over")
		case mayHaveLanded(err) && sentTo(err) != 0:
			e.resolveLost(ctx, req, nonce, sentTo(err))
		}
	}) {
		return claimRow{}, ctx.Err()
	}
	return row, err
}

// claimInTx is claimGated's transaction on a connection of its own, on ctx: [BEGIN; fresh
// (lock, scope check, insert if absent)] (claimFresh), and only if the key has a record the claim statement
// (claimOnce) in the same transaction; a claim granted is committed unless the DB's Close has
// begun or the caller has gone (asked just before the COMMIT is sent). committed: the COMMIT
// was answered. A COMMIT whose reply was lost comes back marked with its backend (sent).
func (e *engine) claimInTx(ctx context.Context, req driver.ClaimRequest, nonce []byte, gone func() bool) (row claimRow, committed bool, err error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return claimRow{}, false, err
	}
	defer conn.Release()                                        // a connection left in a transaction is closed by the pool
	row, got, err := e.claimFresh(ctx, conn, req, nonce, false) // [BEGIN; fresh]
	if err == nil && got != freshClaimed {                      // the key has a record: the claim statement decides
		if done, ok := replayable(req, row); got == freshExisting && ok {
			row = done
		} else {
			row, err = e.claimOnce(ctx, conn, req, nonce)
		}
	}
	end := "ROLLBACK"
	switch {
	case err != nil:
	case !granted(row.outcome):
	case e.closing(): // after the claim's time was taken, before it is visible
		err = driver.ErrClosed
	case gone(): // nobody to hand the claim to: nothing is committed
		err = context.Canceled
	default:
		end = "COMMIT"
	}
	pc := conn.Conn().PgConn()
	cerr := e.checkedCommit(pc, func() error {
		_, err := conn.Exec(ctx, end)
		return err
	})
	switch {
	case err != nil:
		return row, false, err
	case errors.Is(cerr, ErrNotReplicated): // committed on the primary only: not handed out
		e.settleLater(ctx, func(ctx context.Context) { e.undoClaim(ctx, req.Key, row.rec.Token, row.outcome == "took_over") })
		return claimRow{}, false, errorf("pgstore: claim: %w", cerr)
	case cerr != nil:
		return claimRow{}, false, sent(cerr, pc)
	}
	return row, end == "COMMIT", nil
}

// ensureCurrent creates the partitions around the estimated current epoch (after a claim found
// none: maintenance is behind, or a test clock jumped).
func (e *engine) ensureCurrent(ctx context.Context) error {
	cur := e.epochOf(e.estimate())
	for ep := cur - 1; ep <= cur+1; ep++ {
		if err := e.ensurePartition(ctx, ep); err != nil {
			return err
		}
	}
	return nil
}

// claimOnce sends the claim statement once, in q's transaction, which its fresh statement
// began (claimFresh: it holds the key's lock and the scope's). No row back is pgx.ErrNoRows
// (re-send).
func (e *engine) claimOnce(ctx context.Context, q querier, req driver.ClaimRequest, nonce []byte) (claimRow, error) {
	row, err := e.claimSend(ctx, q, req, nonce)
	return row, err
}

// claimSend is claimOnce, with extra statements after the claim in the same batch (DoTx's
// savepoint). It takes no lock and checks no erasure: it is only sent in a transaction
// whose fresh statement (sendFresh) took the key's lock and the scope's, held to its end (an
// erasure of the scope waits for it), and checked the scope's erasures.
func (e *engine) claimSend(ctx context.Context, q querier, req driver.ClaimRequest, nonce []byte, extra ...string) (claimRow, error) {
	b := &pgx.Batch{}
	now := e.nowArg() // the claim's time, on an injected clock
	b.Queue(e.q.claim, e.claimArgs(req, nonce, now)...)
	for _, s := range extra { // statements after the claim, in the same batch (DoTx's savepoint)
		b.Queue(s)
	}
	br := q.SendBatch(ctx, b)
	var row claimRow
	var state int16
	var lease *time.Time
	r := &row.rec
	err := br.QueryRow().Scan(&row.outcome, &r.Token, &r.Attempts, &state, &r.Fingerprint, &r.Result,
		&r.CreatedAt, &r.UpdatedAt, &lease, &row.now, &r.Trace)
	r.State = driver.State(state)
	if lease != nil {
		r.LeaseExpiresAt = *lease
	}
	for range extra {
		if err == nil {
			_, err = br.Exec()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return claimRow{}, err
	}
	row.rec.Key = req.Key
	e.fill(&row.rec)
	row.now = e.saw(row.now, now)
	return row, nil
}

// claimArgs are the claim statements' parameters (queries.claim, queries.fresh), with the
// tombstone bounds when tombstones are on.
func (e *engine) claimArgs(req driver.ClaimRequest, nonce []byte, now any) []any {
	args := []any{[]byte(req.Key.Scope), []byte(req.Key.ID), req.Fingerprint, nonce,
		req.LeaseTTL.Microseconds(), e.retentionUS(), e.width, e.oldest(), now}
	if e.q.tombs {
		args = append(args, e.markerBottom(), e.tombUS())
	}
	return args
}

func (e *engine) claimResult(req driver.ClaimRequest, row claimRow) (driver.ClaimResult, error) {
	res := driver.ClaimResult{Record: row.rec, Now: row.now}
	switch row.outcome {
	case "claimed":
		res.Outcome = driver.Claimed
	case "took_over":
		res.Outcome = driver.TookOver
	case "own": // our claim, whose reply was lost: what it decided then
		res.Outcome = driver.Claimed
		if row.rec.Attempts > 1 {
			res.Outcome = driver.TookOver
		}
	case "done":
		res.Outcome = driver.Replay
	case "mismatch":
		res.Outcome = driver.Mismatch
	case "in_progress":
		res.Outcome = driver.InProgress
	case "expired": // a tombstone: Record holds the time of the key's last write
		res.Outcome = driver.Expired
		res.Record = driver.Record{Key: req.Key, UpdatedAt: row.rec.UpdatedAt, ExpiresAt: row.rec.UpdatedAt.Add(e.o.Retention)}
	default:
		return driver.ClaimResult{}, errorf("pgstore: claim: unknown outcome %q", row.outcome)
	}
	if res.Outcome == driver.Claimed || res.Outcome == driver.TookOver {
		e.leases.put(res.Record.Token, e.epochOf(res.Record.UpdatedAt)) // Finish aims at its partition
	}
	if st := res.Record.State; st == driver.Succeeded || st == driver.Failed {
		e.hint.add(keyHash(req.Key), e.epochOf(res.Record.UpdatedAt)) // the next retry takes the replay fast path
	}
	return res, nil
}

// fill completes a record read from the database.
func (e *engine) fill(r *driver.Record) {
	r.ExpiresAt = r.UpdatedAt.Add(e.o.Retention)
	if r.State != driver.Pending {
		r.LeaseExpiresAt = time.Time{}
		if r.Result == nil {
			r.Result = []byte{}
		}
	} else {
		r.Result = nil
	}
	if r.State == driver.Pending || len(r.Trace) == 0 || len(r.Trace) > driver.MaxTrace {
		r.Trace = nil // only a finished record stores one
	}
}

// scanRecord reads recCols, then the database's time.
func scanRecord(row pgx.Row, r *driver.Record, now *time.Time, extra ...any) error {
	var state *int16
	var lease *time.Time
	var token *int64
	var attempts *int32
	var created, updated *time.Time
	dst := append([]any{&state, &r.Fingerprint, &token, &attempts, &created, &updated, &lease, &r.Result, &r.Trace, now}, extra...)
	if err := row.Scan(dst...); err != nil {
		return err
	}
	if state == nil {
		return errAbsent
	}
	r.State = driver.State(*state)
	r.Token = uint64(*token)
	r.Attempts = uint32(*attempts)
	r.CreatedAt, r.UpdatedAt = *created, *updated
	if lease != nil {
		r.LeaseExpiresAt = *lease
	}
	return nil
}

var errAbsent = errors.New("pgstore: absent")

// Lookup implements driver.Engine: a plain read, no lock, no transaction id.
func (e *engine) Lookup(ctx context.Context, k driver.Key) (driver.Record, bool, time.Time, error) {
	var rec driver.Record
	var now time.Time
	var err error
	for attempt := 0; ; attempt++ {
		rec, now, err = e.lookupOn(ctx, e.pool, k)
		if attempt >= maxLostReply || !lostReply(ctx, err) || sleep(ctx, 10*time.Millisecond<<min(attempt, 5)) != nil {
			break
		}
	}
	return e.lookedUp(k, rec, now, err)
}

// lookupOn is Lookup's statement, once, on q: errAbsent if k has no visible record.
func (e *engine) lookupOn(ctx context.Context, q querier, k driver.Key) (driver.Record, time.Time, error) {
	var rec driver.Record
	var now time.Time
	arg := e.nowArg()
	err := scanRecord(q.QueryRow(ctx, e.q.lookup, []byte(k.Scope), []byte(k.ID), e.oldest(), arg), &rec, &now, &rec.Journal)
	if err == nil || errors.Is(err, errAbsent) {
		now = e.saw(now, arg)
	}
	return rec, now, err
}

// lookedUp is Lookup's answer from lookupOn's.
func (e *engine) lookedUp(k driver.Key, rec driver.Record, now time.Time, err error) (driver.Record, bool, time.Time, error) {
	switch {
	case errors.Is(err, errAbsent):
		return driver.Record{}, false, now, nil
	case err != nil:
		return driver.Record{}, false, time.Time{}, errorf("pgstore: lookup: %w", err)
	}
	rec.Key = k
	e.fill(&rec)
	if !now.Before(rec.ExpiresAt) { // exact at read time: past retention is absent
		return driver.Record{}, false, now, nil
	}
	return rec, true, now, nil
}

// scanPage is how many records one Scan statement reads.
const scanPage = 500

// Scan implements driver.Engine: visible records matching f in (scope, id) order, read page by
// page (each page its own statement and snapshot).
func (e *engine) Scan(ctx context.Context, f driver.Filter) iter.Seq2[driver.Record, error] {
	return func(yield func(driver.Record, error) bool) {
		var afterScope, afterID []byte = []byte{}, []byte{}
		n := 0
		for {
			page := scanPage
			if f.Limit > 0 {
				page = min(page, f.Limit-n)
			}
			rows, err := e.pool.Query(ctx, e.q.scan, e.oldest(), e.retentionUS(), e.nowArg(), []byte(f.Scope),
				int16(f.State), f.Abandoned, afterScope, afterID, page)
			if err != nil {
				yield(driver.Record{}, errorf("pgstore: scan: %w", err))
				return
			}
			var recs []driver.Record
			for rows.Next() {
				var rec driver.Record
				var scope, id []byte
				var now time.Time
				var state int16
				var lease *time.Time
				if err := rows.Scan(&scope, &id, &state, &rec.Fingerprint, &rec.Token, &rec.Attempts, &rec.CreatedAt,
					&rec.UpdatedAt, &lease, &rec.Result, &rec.Trace, &now); err != nil {
					rows.Close()
					yield(driver.Record{}, errorf("pgstore: scan: %w", err))
					return
				}
				rec.State = driver.State(state)
				if lease != nil {
					rec.LeaseExpiresAt = *lease
				}
				rec.Key = driver.Key{Scope: string(scope), ID: string(id)}
				e.fill(&rec)
				recs = append(recs, rec)
				afterScope, afterID = scope, id
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				yield(driver.Record{}, errorf("pgstore: scan: %w", err))
				return
			}
			for _, r := range recs {
				if !yield(r, nil) {
					return
				}
			}
			n += len(recs)
			if len(recs) < page || (f.Limit > 0 && n >= f.Limit) {
				return
			}
		}
	}
}
