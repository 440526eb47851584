package pgstore

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/receiptstore/receipts/driver"
)

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
