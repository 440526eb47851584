package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
)

// FinishWith implements driver.Effects, the engine's unit of atomic work for
// receipts.Lease.Stage (and the HTTP and MCP front ends): the effect runs in
// a transaction that holds the lease's row, and the receipt commits with it.
//
// A lease of DoTx already has its transaction: the effect runs in it, and
// the receipt commits with fn's writes ([finish; COMMIT], commitDoTx).
// Otherwise: BEGIN; the fence (SELECT … FOR UPDATE: ErrLeaseLost if the
// token no longer holds, before the effect); the effect; [the key's advisory
// lock; finish; COMMIT] in one batch. Three round trips besides the effect's
// own. The COMMIT is sent on a context the caller's cannot cancel, and a lost
// reply is settled by reading the record back once the transaction has ended
// on the server (the key's lock: settledLookup), as for DoTx.
func (e *engine) FinishWith(ctx context.Context, k driver.Key, token uint64, state driver.State, result []byte,
	effect func(ctx context.Context, tx any) error,
) (driver.Record, error) {
	if t := e.bound.get(token); t != nil {
		return e.finishBound(ctx, t, k, token, state, result, effect)
	}
	c, err := e.pool.Acquire(ctx)
	if err != nil {
		return driver.Record{}, errorf("pgstore: commit with effects: %w", err)
	}
	t := &txConn{c: c}
	defer t.end(ctx) // rolls back unless committed
	if t.tx, err = c.Begin(ctx); err != nil {
		return driver.Record{}, errorf("pgstore: commit with effects: %w", err)
	}
	if err := e.fenceTx(ctx, t.tx, k, token); err != nil {
		return driver.Record{}, err
	}
	if err := t.checkEffect(effect(ctx, t.fnTx())); err != nil {
		return driver.Record{}, err
	}
	return e.commitDoTx(context.WithoutCancel(ctx), t, driver.LeaseInfo{Key: k, Token: token}, state, result)
}

// checkEffect returns what an effect that ran in t and returned err did wrong: err, or
// driver.ErrEffectEnded if it ended t's transaction itself (a COMMIT or ROLLBACK sent as a
// statement: pgx.Tx's Commit and Rollback are refused, fnTx), whatever it returned. Its
// writes may then be durable without the receipt; the connection is no longer in a
// transaction, and the root abandons the claim.
func (t *txConn) checkEffect(err error) error {
	if t.c.Conn().PgConn().TxStatus() == 'I' {
		if err != nil {
			return fmt.Errorf("pgstore: the effect: %w: it sent COMMIT or ROLLBACK through the transaction, so its writes may be durable without the receipt (it returned: %w)", driver.ErrEffectEnded, err)
		}
		return fmt.Errorf("pgstore: the effect: %w: it sent COMMIT or ROLLBACK through the transaction, so its writes may be durable without the receipt", driver.ErrEffectEnded)
	}
	if err != nil {
		return errorf("pgstore: the effect: %w", err)
	}
	return nil
}

// boundTxs are the transactions of DoTx's leases, by token: while DoTx's fn
// runs, the root's outcome protocol (receipts.Lease.Run) settles the lease
// through the engine's Finish, Abandon and Release, and for these tokens
// they act in the claim's transaction. n lets the other leases' writes skip
// the map with one atomic load.
type boundTxs struct {
	n atomic.Int64
	m sync.Map // uint64 → *txConn
}

func (b *boundTxs) bind(token uint64, t *txConn) {
	b.m.Store(token, t)
	b.n.Add(1)
}

func (b *boundTxs) unbind(token uint64) {
	if _, ok := b.m.LoadAndDelete(token); ok {
		b.n.Add(-1)
	}
}

// get returns the transaction bound to token, or nil.
func (b *boundTxs) get(token uint64) *txConn {
	if b.n.Load() == 0 {
		return nil
	}
	t, _ := b.m.Load(token)
	tc, _ := t.(*txConn)
	return tc
}

// errAbortedSuccess: fn returned no error over a transaction a failed statement aborted; it
// cannot commit, so the outcome is not recorded and the root abandons the claim.
var errAbortedSuccess = errors.New("pgstore: dotx: fn returned no error, but a statement it ran in tx failed and aborted the transaction, which cannot commit")

// finishBound records state and result in DoTx's transaction t, after effect (the lease's
// staged effects) if there is one, and commits it. If the outcome cannot be recorded
// without ending t (an effect failed, or fn's transaction is aborted), t stays open and
// bound: the root then abandons the claim, in t (abandonBound).
func (e *engine) finishBound(ctx context.Context, t *txConn, k driver.Key, token uint64, state driver.State, result []byte,
	effect func(ctx context.Context, tx any) error,
) (driver.Record, error) {
	if state == driver.Succeeded {
		if t.aborted() {
			return driver.Record{}, errAbortedSuccess
		}
		if effect != nil {
			if err := t.checkEffect(effect(ctx, t.fnTx())); err != nil {
				if errors.Is(err, driver.ErrEffectEnded) { // t is over: the claim is abandoned on another connection
					e.bound.unbind(token)
					t.end(ctx)
				}
				return driver.Record{}, err
			}
		}
	}
	defer e.bound.unbind(token)
	return e.commitDoTx(context.WithoutCancel(ctx), t, driver.LeaseInfo{Key: k, Token: token}, state, result)
}

// abandonBound abandons DoTx's claim in its transaction t: fn's writes are rolled back to
// the savepoint taken after the claim, the claim's lease ends now, and t commits, so the
// next attempt takes the claim over, Recovered (fn held a lease with a ProviderKey and may
// have reached beyond the transaction). If the commit's reply is lost, the record says
// whether it landed.
func (e *engine) abandonBound(ctx context.Context, t *txConn, k driver.Key, token uint64) error {
	defer e.bound.unbind(token)
	defer t.end(ctx)
	ctx = context.WithoutCancel(ctx)
	e.leases.drop(token)
	// Alone and in the simple protocol: in an aborted transaction the server prepares
	// nothing but a rollback (commitDoTx).
	if _, err := t.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+effectSavepoint, pgx.QueryExecModeSimpleProtocol); err != nil {
		return errorf("pgstore: dotx: abandon: roll back the effect: %w", err)
	}
	if _, _, err := e.write(ctx, t.tx, "abandon", e.q.abandon, k, e.fencedArgs(k, token), nil); err != nil {
		return errorf("pgstore: dotx: %w", err)
	}
	err := e.checkedCommit(t.c.Conn().PgConn(), func() error { return t.tx.Commit(ctx) })
	if err == nil {
		e.wake(k)
		return nil
	}
	if errors.Is(err, ErrNotReplicated) {
		return errorf("pgstore: dotx: abandon: %w", err)
	}
	if !lostReply(ctx, err) {
		return errorf("pgstore: dotx: abandon: commit: %w", err)
	}
	t.end(ctx)                                  // the read below needs a connection of the pool: hand this one back first
	cur, found, lerr := e.settledLookup(ctx, k) // once the transaction has ended on the server
	switch {
	case lerr != nil:
		return errorf("pgstore: dotx: abandon: commit reply lost and the record cannot be read: %w (%w)", err, lerr)
	case found && cur.Token == token && cur.State == driver.Pending:
		e.wake(k)
		return nil
	}
	return errorf("pgstore: dotx: abandon: the commit did not land, and the claim with it: %w", err)
}

// releaseBound releases DoTx's claim: t rolls back, and the claim with it. The key is as it
// was before the claim: free, or the abandoned claim this attempt took over (so the next
// attempt is Recovered, as Release keeps it).
func (e *engine) releaseBound(ctx context.Context, t *txConn, k driver.Key, token uint64) {
	e.bound.unbind(token)
	e.leases.drop(token)
	t.end(ctx)
	e.wake(k)
}

// errBoundForget: Forget settles a reconciled claim; DoTx's leases are released instead.
var errBoundForget = fmt.Errorf("%w: Forget of a DoTx lease (return receipts.NotPerformed from fn)", receipts.ErrUnsupported)
