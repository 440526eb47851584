package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/receiptstore/receipts/driver"
)

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
			serr := scanRecord(rows, &row.rec, &row.now, &claimed, &i)
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
