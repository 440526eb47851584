package pgstore

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/receiptstore/receipts/driver"
)

// Claim implements driver.Engine: a retry of a key this engine recently saw finished (the
// hint: replay.go) is answered from one plain read (replayFast); otherwise claimDecide decides
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
		if res, ok := e.replayFast(ctx, req, ep); ok { // a finished record: one plain read (replay.go)
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

// claimDecide is Claim after its replay fast path (replay.go): a
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
	// pgtype's nullable values, not pointers to pointers: pgx allocates each non-NULL
	// pointee, and plans a scan through the pointer for each column of each row (six
	// allocations of a replay's 35, and pgx's scan planning 5% of the client's CPU per
	// replay at one caller).
	var state pgtype.Int2
	var token pgtype.Int8
	var attempts pgtype.Int4
	var created, updated, lease pgtype.Timestamptz
	var buf [16]any
	dst := append(append(buf[:0], &state, &r.Fingerprint, &token, &attempts, &created, &updated, &lease, &r.Result, &r.Trace, now), extra...)
	if err := row.Scan(dst...); err != nil {
		return err
	}
	if !state.Valid {
		return errAbsent
	}
	if created.InfinityModifier != pgtype.Finite || updated.InfinityModifier != pgtype.Finite || lease.InfinityModifier != pgtype.Finite {
		return fmt.Errorf("%w: pgstore: a record with an infinite timestamp", driver.ErrCorrupt)
	}
	r.State = driver.State(state.Int16)
	r.Token = uint64(token.Int64)
	r.Attempts = uint32(attempts.Int32)
	r.CreatedAt, r.UpdatedAt = created.Time, updated.Time
	if lease.Valid {
		r.LeaseExpiresAt = lease.Time
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
	err := queryRecord(ctx, q, e.q.lookup, []any{[]byte(k.Scope), []byte(k.ID), e.oldest(), arg}, &rec, &now, &rec.Journal)
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
		err = batchRecord(br, &row.rec, &row.now, &claimed)
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

// First claims of different keys share a transaction when they arrive together (combiner.go).
//
// A first call's claim is one round trip, one statement in its own transaction (claimFresh:
// freshFnSQL). A batch of them is one statement too (freshManyFnSQL): each key whose lock was
// free gets the
// decision its own claimFresh would have made, on a snapshot taken after its lock was taken
// (the statement is the fresh statement over an array of keys).
//
// Failure keeps each claim's own semantics:
//   - A key whose lock another transaction holds is left out (the batch only takes free
//     locks) and claims alone, waiting for its lock as a claim sent alone does.
//   - A server error (a unique violation, a missing partition) rolls the whole transaction
//     back: nothing was written, and each claim is sent again alone.
//   - A lost reply (the connection broke, or the sender's context ended mid-batch) may or
//     may not have committed the batch: every member gets a lost reply, and claimDecide
//     retries it with its nonce on the slow path, which recognises a claim that landed.
//   - A member whose context ends while its batch is in flight returns at once, the sender
//     as any other (the batch runs detached from every caller's context: detach.go); the
//     claim the batch granted it, if any, is undone once the answer is in (deleted by its
//     token, as undoFresh does), and after a lost reply it is looked up by its nonce and
//     undone if it landed (settleFresh), so no lease is left without a holder.

// errBatchLost is what a batch member gets when the batch's reply was lost: lostReply.
var errBatchLost = errors.New("pgstore: batch reply lost")

// freshV is a first claim's arguments and answer in the claim combiner.
type freshV struct {
	req   driver.ClaimRequest
	nonce []byte

	row  claimRow
	got  freshGot
	err  error
	solo bool // not decided by the batch (its lock was held elsewhere, or the batch failed on the server): send it alone
	// sentTo is the backend a claim whose reply was lost was sent to (0: none, or unknown).
	sentTo uint32
}

type freshCall = batchCall[freshV]

// newFreshCombiner is the engine's combiner of first claims. Its batches are sent detached
// (engine.detach): a batch carries its COMMIT, and a caller whose context ends never cuts it
// short (neither pgx's deadline nor its cancel request reaches a COMMIT already sent); a
// member whose caller left meanwhile is settled by gone, once the answer is in.
func (e *engine) newFreshCombiner() *combiner[freshV] {
	return &combiner[freshV]{
		send: func(ctx context.Context, self *freshCall, batch []*freshCall) {
			if len(batch) == 1 {
				self.v.row, self.v.got, self.v.err = e.freshAlone(ctx, self.v.req, self.v.nonce)
				return
			}
			e.freshMany(ctx, self, batch)
		},
		gone:   func(c *freshCall) { e.settleFresh(c.ctx, &c.v) },
		detach: e.detach,
	}
}

// settleFresh settles the first claim v of a caller who left before its answer came: a claim
// the batch (or the claim alone) granted has no holder and is undone by its token; after a
// lost reply the claim may or may not have landed, and is looked up by its nonce and undone
// if it did (resolveLost). Nothing else was written for it. A member that was to claim alone
// (solo) sent nothing.
func (e *engine) settleFresh(ctx context.Context, v *freshV) {
	switch {
	case v.solo:
	case v.err == nil && v.got == freshClaimed:
		e.undoClaim(ctx, v.req.Key, v.row.rec.Token, false)
	case mayHaveLanded(v.err):
		e.resolveLost(ctx, v.req, v.nonce, v.sentTo)
	}
}

// freshOneTrip is claimGated's first round trip: claimFresh with COMMIT for req, alone or in
// a batch with other first claims. Its answers are claimFresh's. If ctx ends first, it
// returns ctx's error, and the claim, if it is granted, is undone (settleFresh).
func (e *engine) freshOneTrip(ctx context.Context, req driver.ClaimRequest, nonce []byte) (claimRow, freshGot, error) {
	if e.testNoBatch {
		return e.freshDetached(ctx, req, nonce)
	}
	c := &freshCall{ctx: ctx, key: req.Key, v: freshV{req: req, nonce: nonce}}
	if !e.claims.do(c) {
		return claimRow{}, freshNone, ctx.Err()
	}
	if c.v.solo {
		return e.freshDetached(ctx, req, nonce)
	}
	return c.v.row, c.v.got, c.v.err
}

// freshDetached is freshAlone detached from ctx, as the combiner sends a batch: if ctx ends
// first it returns ctx's error, and the claim is settled once its answer is in.
func (e *engine) freshDetached(ctx context.Context, req driver.ClaimRequest, nonce []byte) (claimRow, freshGot, error) {
	v := freshV{req: req, nonce: nonce}
	if !e.detachCall(ctx, func(ctx context.Context, _ func() bool) {
		v.row, v.got, v.err = e.freshAlone(ctx, req, nonce)
		v.sentTo = sentTo(v.err)
	}, func() { e.settleFresh(ctx, &v) }) {
		return claimRow{}, freshNone, ctx.Err()
	}
	return v.row, v.got, v.err
}

// freshAlone is claimFresh with COMMIT on a connection of its own: one first claim alone. A
// lost reply comes back marked with the backend it was sent to (sentTo).
func (e *engine) freshAlone(ctx context.Context, req driver.ClaimRequest, nonce []byte) (claimRow, freshGot, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return claimRow{}, freshNone, err
	}
	defer conn.Release()
	pc := conn.Conn().PgConn()
	var row claimRow
	var got freshGot
	err = e.checkedCommit(pc, func() (err error) {
		row, got, err = e.claimFresh(ctx, conn, req, nonce, true) // the fresh statement, its own transaction
		return err
	})
	if errors.Is(err, ErrNotReplicated) { // committed on the primary only: not handed out
		if got == freshClaimed {
			token := row.rec.Token
			e.settleLater(ctx, func(ctx context.Context) { e.undoClaim(ctx, req.Key, token, false) })
		}
		return claimRow{}, freshNone, errorf("pgstore: claim: %w", err)
	}
	if err != nil && pc.TxStatus() != 'I' { // the batch failed inside its transaction
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	return row, got, sent(err, pc)
}

// freshMany sends the batch's statement (freshManyFnSQL, its own transaction) for the calls
// of batch (distinct keys)
// in one round trip, on ctx (detached from every caller's: newFreshCombiner), and fills in
// each call's answer.
func (e *engine) freshMany(ctx context.Context, self *freshCall, batch []*freshCall) {
	n := len(batch)
	scopes, ids, fps, nonces := make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
	leases := make([]int64, n)
	locks, slocks, sids := make([]int32, n), make([]int32, n), make([][]byte, n)
	for i, c := range batch {
		scopes[i], ids[i] = []byte(c.key.Scope), []byte(c.key.ID)
		fps[i], nonces[i], leases[i] = c.v.req.Fingerprint, c.v.nonce, c.v.req.LeaseTTL.Microseconds()
		locks[i] = lockID(keyHash(c.key))
		sids[i] = driver.ScopeID(e.secret, c.key.Scope)
		slocks[i] = scopeLock(sids[i])
	}
	now := e.nowArg()
	var mbottom, rbottom any // NULL: tombstones off
	if e.q.tombs {
		mb := e.markerBottom()
		mbottom, rbottom = mb, mb*(e.mwidth/e.width) // recordBottom
	}
	args := []any{locks, slocks, sids, scopes, ids, fps, nonces, leases, e.width, e.oldest(), now, e.q.injected,
		mbottom, rbottom, e.tombUS()}

	var pid uint32 // the backend the batch went to
	fail := func(err error) {
		e.batchFailures.Add(1)
		for _, c := range batch {
			c.v.sentTo = pid
			switch {
			case !mayHaveLanded(err): // rolled back: nothing written
				c.v.solo = true
			case c == self:
				c.v.err = err
			default: // the sender's reply was lost, maybe after the commit
				c.v.err = fmt.Errorf("%w: %v", errBatchLost, err)
			}
		}
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil { // nothing sent: the sender has its error, the others claim alone
		e.batchFailures.Add(1)
		for _, c := range batch {
			if c == self {
				c.v.err = err
			} else {
				c.v.solo = true
			}
		}
		return
	}
	defer conn.Release()
	pid = conn.Conn().PgConn().PID()
	got := make([]bool, n)
	locked := make([]bool, n)
	err = e.checkedCommit(conn.Conn().PgConn(), func() (err error) {
		rows, err := conn.Query(ctx, e.q.freshManyFn, args...) // one statement, its own transaction
		if err != nil {
			return err
		}
		for rows.Next() {
			var row claimRow
			var claimed *bool
			var i int64
			serr := scanRow(rows, &row.rec, &row.now, &claimed, &i)
			switch {
			case claimed == nil && errors.Is(serr, errAbsent): // key i was locked and decided
				if i < 1 || i > int64(n) || locked[i-1] {
					err = errorf("pgstore: claim batch: key %d of %d locked twice", i, n)
					break
				}
				locked[i-1] = true
				continue
			case serr != nil:
				err = serr
			case claimed == nil:
				err = errorf("pgstore: claim batch: a record row without its flag")
			}
			if err != nil {
				break
			}
			i = member(i, n)
			if i < 1 || i > int64(n) || got[i-1] || !locked[i-1] {
				err = errorf("pgstore: claim batch: row for key %d of %d", i, n)
				break
			}
			got[i-1] = true
			c := &batch[i-1].v
			c.row, c.got = row, freshExisting
			if *claimed {
				c.got = freshClaimed
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		return err
	})
	unconfirmed := err
	if errors.Is(err, ErrNotReplicated) { // its claims are undone below; the other answers stand
		err = nil
	} else {
		unconfirmed = nil
	}
	if err == nil && e.testLoseBatch != nil && e.testLoseBatch() {
		err = errBatchLost // as if the connection broke after the COMMIT
	}
	if err != nil {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		for _, c := range batch {
			c.v.row, c.v.got = claimRow{}, freshNone
		}
		fail(err)
		return
	}
	// as claimFresh finishes each answer
	for i, bc := range batch {
		c := &bc.v
		if !locked[i] { // its lock was taken: it claims alone, waiting for the lock
			c.solo = true
			continue
		}
		if c.got == freshNone { // no row: a tombstone in force; the claim statement decides
			continue
		}
		c.row.rec.Key = bc.key
		e.fill(&c.row.rec)
		if c.got == freshClaimed {
			c.row.outcome = "claimed"
			c.row.now = e.saw(c.row.rec.CreatedAt, now)
		} else {
			c.row.now = e.saw(c.row.now, now)
		}
	}
	if unconfirmed != nil { // committed on the primary only: no claim of it is handed out
		type grant struct {
			k     driver.Key
			token uint64
		}
		var undo []grant
		for _, bc := range batch {
			if c := &bc.v; c.got == freshClaimed {
				undo = append(undo, grant{bc.key, c.row.rec.Token})
				c.row, c.got, c.err = claimRow{}, freshNone, errorf("pgstore: claim: %w", unconfirmed)
			}
		}
		e.settleLater(ctx, func(ctx context.Context) {
			for _, g := range undo {
				e.undoClaim(ctx, g.k, g.token, false)
			}
		})
	}
}
