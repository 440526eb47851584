package pgstore

import (
	"context"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Reads of the replay fast path that arrive together share a statement (combiner.go): the
// reads of keys the hint places in the same partition as the sender's are one statement over
// arrays of keys (queries.lookupManyIn), one snapshot and one clock for all of them, each
// key's row being what its own lookupIn would read at that time. A key whose row is not
// there, a key of another partition, and every key of a batch that failed, read alone
// (lookupInAlone, which falls back to the parent's read as before).

// lookupV is one fast-path read's arguments and answer in the lookup combiner.
type lookupV struct {
	epoch int64

	rec   driver.Record
	found bool
	now   time.Time
	err   error
	done  bool // rec, found, now and err are lookupIn's answer; else the key reads alone
}

type lookupCall = batchCall[lookupV]

// newLookupCombiner is the engine's combiner of fast-path reads.
func (e *engine) newLookupCombiner() *combiner[lookupV] {
	return &combiner[lookupV]{send: func(ctx context.Context, self *lookupCall, batch []*lookupCall) {
		if in := samePartition(self, batch, func(v *lookupV) int64 { return v.epoch }); len(in) > 1 {
			e.lookupMany(ctx, self, in)
			return
		}
		v := &self.v
		v.rec, v.found, v.now, v.err = e.lookupInAlone(ctx, self.key, v.epoch)
		v.done = true
	}}
}

// lookupMany reads the keys of in (the sender's among them), all placed in the sender's
// partition, in one statement.
func (e *engine) lookupMany(ctx context.Context, self *lookupCall, in []*lookupCall) {
	ep := self.v.epoch
	n := len(in)
	scopes, ids := make([][]byte, n), make([][]byte, n)
	for i, c := range in {
		scopes[i], ids[i] = []byte(c.key.Scope), []byte(c.key.ID)
	}
	sql := e.lookupManyText.get(ep, func() string { return e.q.lookupManyIn(partName(famRecords, ep)) })
	arg := e.nowArg()
	rows, err := e.pool.Query(ctx, sql, scopes, ids, arg)
	if err != nil {
		e.batchFailures.Add(1)
		return // each key reads alone
	}
	type read struct {
		rec driver.Record
		now time.Time
	}
	got := make([]*read, n)
	for rows.Next() {
		r := &read{}
		var i int64
		err = scanRecord(rows, &r.rec, &r.now, &i)
		i = member(i, n)
		if err == errAbsent { // no row of that key in the partition: it reads alone
			err = nil
			continue
		}
		if err != nil {
			break
		}
		if i < 1 || i > int64(n) || got[i-1] != nil {
			err = errorf("pgstore: lookup batch: row for key %d of %d", i, n)
			break
		}
		got[i-1] = r
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil || (e.testLoseBatch != nil && e.testLoseBatch()) {
		e.batchFailures.Add(1)
		return
	}
	for i, c := range in {
		if r := got[i]; r != nil {
			now := e.saw(r.now, arg)
			e.lookupInHits.Add(1)
			v := &c.v
			v.rec, v.found, v.now, v.err = e.lookupInAnswer(c.key, r.rec, now)
			v.done = true
		}
	}
}
