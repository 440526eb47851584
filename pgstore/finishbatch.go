package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/receiptstore/receipts/driver"
)

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
			if err = scanRecord(rows, &w.rec, &w.now, &xid, &i); err != nil {
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
