package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// First claims of different keys share a transaction when they arrive together (combiner.go).
//
// A first call's claim is one round trip, [BEGIN; lock; fresh; COMMIT] (claimFresh). A batch
// of them is [BEGIN; lockMany; freshMany; COMMIT]: each key whose lock was free gets the
// decision its own claimFresh would have made, on a snapshot taken after its lock was taken
// (the statement is the fresh statement over an array of keys).
//
// Failure keeps each claim's own semantics:
//   - A key whose lock another transaction holds is left out (lockMany only takes free
//     locks) and claims alone, waiting for its lock as a claim sent alone does.
//   - A server error (a unique violation, a missing partition) rolls the whole transaction
//     back: nothing was written, and each claim is sent again alone.
//   - A lost reply (the connection broke, or the sender's context ended mid-batch) may or
//     may not have committed the batch: every member gets a lost reply, and claimDecide
//     retries it with its nonce on the slow path, which recognises a claim that landed.
//   - A member whose context ends while its batch is in flight returns at once; the claim
//     the batch granted it, if any, is undone by the sender (deleted by its token, as
//     undoFresh does), so no lease is left without a holder.

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
}

type freshCall = batchCall[freshV]

// newFreshCombiner is the engine's combiner of first claims.
func (e *engine) newFreshCombiner() *combiner[freshV] {
	return &combiner[freshV]{
		send: func(self *freshCall, batch []*freshCall) {
			if len(batch) == 1 {
				self.v.row, self.v.got, self.v.err = e.freshAlone(self.ctx, self.v.req, self.v.nonce)
				return
			}
			e.freshMany(self, batch)
		},
		gone: func(c *freshCall) { // a claim granted to a caller that left has no holder
			if c.v.err == nil && !c.v.solo && c.v.got == freshClaimed {
				_ = e.undoFresh(c.ctx, c.v.req, c.v.row.rec.Token)
			}
		},
	}
}

// freshOneTrip is claimGated's first round trip: claimFresh with COMMIT for req, alone or in
// a batch with other first claims. Its answers are claimFresh's.
func (e *engine) freshOneTrip(ctx context.Context, req driver.ClaimRequest, nonce []byte) (claimRow, freshGot, error) {
	if e.testNoBatch {
		return e.freshAlone(ctx, req, nonce)
	}
	c := &freshCall{ctx: ctx, key: req.Key, v: freshV{req: req, nonce: nonce}}
	if !e.claims.do(c) {
		return claimRow{}, freshNone, ctx.Err()
	}
	if c.v.solo {
		return e.freshAlone(ctx, req, nonce)
	}
	return c.v.row, c.v.got, c.v.err
}

// freshAlone is claimFresh with COMMIT on a connection of its own: one first claim alone.
func (e *engine) freshAlone(ctx context.Context, req driver.ClaimRequest, nonce []byte) (claimRow, freshGot, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return claimRow{}, freshNone, err
	}
	defer conn.Release()
	row, got, err := e.claimFresh(ctx, conn, req, nonce, true) // [BEGIN; lock; insert if absent; COMMIT]
	if err != nil && conn.Conn().PgConn().TxStatus() != 'I' {  // the batch failed inside its transaction
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	return row, got, err
}

// freshMany sends [BEGIN; lockMany; freshMany; COMMIT] for the calls of batch (distinct keys)
// in one round trip, on the sender's (self's) context, and fills in each call's answer.
func (e *engine) freshMany(self *freshCall, batch []*freshCall) {
	ctx := self.ctx
	n := len(batch)
	scopes, ids, fps, nonces := make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
	leases := make([]int64, n)
	locks := make([]int32, n)
	for i, c := range batch {
		scopes[i], ids[i] = []byte(c.key.Scope), []byte(c.key.ID)
		fps[i], nonces[i], leases[i] = c.v.req.Fingerprint, c.v.nonce, c.v.req.LeaseTTL.Microseconds()
		locks[i] = lockID(keyHash(c.key))
	}
	now := e.nowArg()
	args := []any{scopes, ids, fps, nonces, leases, e.retentionUS(), e.width, e.oldest(), now}
	if e.q.tombs {
		args = append(args, e.markerBottom(), e.tombUS())
	}

	fail := func(err error) {
		e.batchFailures.Add(1)
		for _, c := range batch {
			switch {
			case pgCode(err) != "": // rolled back: nothing written
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
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(e.q.lockMany, lockClass, locks)
	b.Queue(e.q.freshMany, args...)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	got := make([]bool, n)
	locked := make([]bool, n)
	if _, err = br.Exec(); err == nil {
		var list string
		if err = br.QueryRow().Scan(&list); err == nil {
			for _, f := range strings.Split(list, ",") {
				if i, perr := strconv.Atoi(f); perr == nil && i >= 1 && i <= n {
					locked[i-1] = true
				}
			}
		}
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			for rows.Next() {
				var row claimRow
				var claimed bool
				var i int64
				if err = scanRecord(rows, &row.rec, &row.now, &claimed, &i); err != nil {
					break
				}
				if i < 1 || i > int64(n) || got[i-1] || !locked[i-1] {
					err = fmt.Errorf("pgstore: claim batch: row for key %d of %d", i, n)
					break
				}
				got[i-1] = true
				c := &batch[i-1].v
				c.row, c.got = row, freshExisting
				if claimed {
					c.got = freshClaimed
				}
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	}
	if err == nil {
		_, err = br.Exec() // COMMIT
	}
	if cerr := br.Close(); err == nil {
		err = cerr
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
}
