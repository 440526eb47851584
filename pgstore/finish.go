package pgstore

import (
	"bytes"
	"context"
	"errors"
	"sync"
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
			err = queryRecord(ctx, q, sql, args, &rec, &now, &xid)
		} else { // the statement commits on its own
			err = e.commitRow(ctx, func(q querier) error { return queryRecord(ctx, q, sql, args, &rec, &now, &xid) })
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

// commitRow runs read, which sends a statement that commits on its own and reads its row, on
// one of the pool's connections; the COMMIT goes through checkedCommit.
func (e *engine) commitRow(ctx context.Context, read func(q querier) error) error {
	c, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return e.checkedCommit(c.Conn().PgConn(), func() error { return read(c) })
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
		err := e.commitRow(ctx, func(q querier) error { return q.QueryRow(ctx, e.q.del, args...).Scan(&now) })
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

// leaseCap bounds the leases remembered by leaseEpochs: when it is reached the map starts
// over (a forgotten lease's Finish sends the parent's statement: slower, never wrong).
const leaseCap = 1 << 14

// leaseEpochs remembers, for the leases this engine granted or renewed and has not finished
// yet, the epoch of the record's last write (the partition its row is in), so that Finish can
// write to that partition alone (finishIn). It only picks Finish's first statement, never its
// answer: a lease whose row is no longer there (taken over, moved by a write on another node,
// its partition dropped) gets no row from it, and Finish then sends the fenced UPDATE of the
// parent, which decides as it always did.
type leaseEpochs struct {
	mu sync.Mutex
	m  map[uint64]int64 // token → records epoch
}

// put remembers that token's record was last written in epoch.
func (l *leaseEpochs) put(token uint64, epoch int64) {
	l.mu.Lock()
	if l.m == nil || len(l.m) >= leaseCap {
		l.m = make(map[uint64]int64, 64)
	}
	l.m[token] = epoch
	l.mu.Unlock()
}

// take returns and forgets token's epoch.
func (l *leaseEpochs) take(token uint64) (epoch int64, ok bool) {
	l.mu.Lock()
	epoch, ok = l.m[token]
	if ok {
		delete(l.m, token)
	}
	l.mu.Unlock()
	return epoch, ok
}

// drop forgets token.
func (l *leaseEpochs) drop(token uint64) {
	l.mu.Lock()
	delete(l.m, token)
	l.mu.Unlock()
}

// finishIn is the records epoch where token's record was last written, if this engine
// remembers it and its partition is live: Finish's statement is then aimed at that partition
// (finishInFor; ok false: send the parent's).
//
// Why it decides as the parent's statement does: a key has at most one row in the live
// partitions (lookupIn), and the fenced UPDATE matches that row only if it is Pending with
// this token and visible. The aimed statement adds two conditions, that the row is in
// partition ep and that the statement's epoch is ep (so the write, which moves the row to the
// statement's epoch, keeps it there); both only narrow the match. When it matches, it writes
// what the parent's would (the same SET, the marker of the same markers partition); when it
// does not, Finish sends the parent's statement, which finds the row wherever it is, or
// reports the lease lost.
func (e *engine) finishIn(token uint64) (ep int64, ok bool) {
	ep, ok = e.leases.take(token)
	if !ok || ep < e.oldest() || e.testNoFinishIn {
		return 0, false
	}
	return ep, true
}

// finishInFor is the aimed statement's text for records epoch ep.
func (e *engine) finishInFor(ep int64) string {
	return e.finishInText.get(ep, func() string { return e.q.finishInSQL(ep, e.markerEpoch(ep)) })
}

// finishAimedAt is finishAimed for the finish of token (state, result, trace context)
// aimed at records epoch ep.
func (e *engine) finishAimedAt(ctx context.Context, k driver.Key, ep int64, token uint64, state driver.State, result, trace []byte) (driver.Record, bool, error) {
	args := e.fencedArgs(k, token, int16(state), result, trace)
	return e.finishAimed(ctx, e.finishInFor(ep), k, args, finished(token, state, result))
}

// finishAimed runs the aimed statement (finishIn). ok false: it matched no row, or the server
// refused it (the partition was dropped meanwhile, say), and nothing was written: Finish
// sends the parent's statement. Other errors (a reply lost beyond write's retries, a
// cancelled context) are Finish's answer.
func (e *engine) finishAimed(ctx context.Context, sql string, k driver.Key, args []any, verify func(driver.Record) bool) (rec driver.Record, ok bool, err error) {
	rec, _, err = e.write(ctx, e.pool, "finish", sql, k, args, verify)
	var pe *pgconn.PgError
	switch {
	case err == nil:
		e.finishInHits.Add(1)
		return rec, true, nil
	case errors.Is(err, driver.ErrLeaseLost), errors.As(err, &pe) && !lostReply(ctx, err):
		return driver.Record{}, false, nil
	default:
		return driver.Record{}, true, err
	}
}

// epochTexts keeps the statement texts that name one epoch's partition (lookupIn's, finishIn's):
// the few epochs in use, at most 64.
type epochTexts struct {
	mu sync.Mutex
	m  map[int64]string
}

// get returns epoch's text, building it once.
func (t *epochTexts) get(epoch int64, build func() string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.m[epoch]; ok {
		return s
	}
	if t.m == nil || len(t.m) >= 64 {
		t.m = make(map[int64]string)
	}
	s := build()
	t.m[epoch] = s
	return s
}

// Finishes of different leases share a statement when they arrive together (combiner.go).
//
// A finish aimed at its record's partition (finishIn) is one autocommitted statement. A batch
// of finishes aimed at the same partition is one statement over arrays of keys
// (queries.finishManyIn): each lease's row is fenced, and written, as its own aimed statement
// would fence and write it. A member whose row it did not write (its fence did not hold
// there: taken over, moved to another partition) goes on as Finish does after an aimed
// statement that matched nothing: the parent's statement decides. So does every member of
// a batch that failed: on a server error nothing was written; after a lost reply the
// batch may have committed, and the parent's statement then finds the row finished, which
// Finish recognises as its own outcome (finished: token, state and result) before
// reporting the lease lost. Members aimed at another partition than the sender's go on
// alone the same way (the parent's statement: only at an epoch boundary).

// finishV is one aimed finish's arguments and answer in the finish combiner.
type finishV struct {
	ep     int64 // the records epoch the statement is aimed at
	token  uint64
	state  driver.State
	result []byte
	trace  []byte

	rec  driver.Record
	done bool // rec and err are Finish's answer; else Finish sends the parent's statement
	err  error
}

type finishCall = batchCall[finishV]

// newFinishCombiner is the engine's combiner of aimed finishes.
func (e *engine) newFinishCombiner() *combiner[finishV] {
	return &combiner[finishV]{send: func(ctx context.Context, self *finishCall, batch []*finishCall) {
		if in := samePartition(self, batch, func(v *finishV) int64 { return v.ep }); len(in) > 1 {
			e.finishMany(ctx, self, in)
			return
		}
		v := &self.v
		v.rec, v.done, v.err = e.finishAimedAt(ctx, self.key, v.ep, v.token, v.state, v.result, v.trace)
	}}
}

// finishMany sends the finishes of in (the sender's among them), all aimed at the sender's
// partition, in one statement and fills in the answers of those it wrote; the others are
// left to the parent's statement.
func (e *engine) finishMany(ctx context.Context, self *finishCall, in []*finishCall) {
	ep := self.v.ep
	n := len(in)
	scopes, ids, results, traces := make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
	tokens, states := make([]int64, n), make([]int16, n)
	for i, c := range in {
		scopes[i], ids[i] = []byte(c.key.Scope), []byte(c.key.ID)
		tokens[i], states[i], results[i], traces[i] = int64(c.v.token), int16(c.v.state), c.v.result, c.v.trace
	}
	sql := e.finishManyText.get(ep, func() string { return e.q.finishManyInSQL(ep, e.markerEpoch(ep)) })
	type wrote struct {
		rec driver.Record
		now time.Time
	}
	got := make([]*wrote, n)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		e.batchFailures.Add(1)
		return // nothing sent: the parent's statement decides for each
	}
	defer conn.Release()
	err = e.checkedCommit(conn.Conn().PgConn(), func() error {
		rows, err := conn.Query(ctx, sql, scopes, ids, tokens, e.oldest(), e.retentionUS(), e.width, e.nowArg(), states, results, traces)
		if err != nil {
			return err
		}
		for rows.Next() {
			w := &wrote{}
			var xid string
			var i int64
			if err = scanRow(rows, &w.rec, &w.now, &xid, &i); err != nil {
				break
			}
			i = member(i, n)
			if i < 1 || i > int64(n) || got[i-1] != nil {
				err = errorf("pgstore: finish batch: row for key %d of %d", i, n)
				break
			}
			got[i-1] = w
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		return err
	})
	if errors.Is(err, ErrNotReplicated) { // written, on the primary only: an unknown outcome for each
		for i, c := range in {
			if got[i] != nil {
				c.v.done, c.v.err = true, errorf("pgstore: finish: %w", err)
			}
		}
		return
	}
	if err != nil || (e.testLoseBatch != nil && e.testLoseBatch()) {
		e.batchFailures.Add(1)
		return // see above: on a lost reply the parent's statement finds what was written
	}
	for i, c := range in {
		if w := got[i]; w != nil {
			w.rec.Key = c.key
			e.fill(&w.rec)
			e.saw(w.now, nil)
			e.finishInHits.Add(1)
			c.v.rec, c.v.done = w.rec, true
		}
	}
}
