package pgstore

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
)

// txConn is a DoTx transaction on a pool connection of its own, begun by the claim batch
// itself ([BEGIN; fresh; SAVEPOINT]: claimTxOnce). DoTx commits it with the receipt's
// write in one batch ([finish; COMMIT]: commitDoTx), then hands the connection back to the
// pool without the round trip pgx's Tx.Commit would make (the connection is idle again, so
// the pool keeps it). Every other ending goes through end.
type txConn struct {
	c     *pgxpool.Conn
	tx    pgx.Tx // pgx's transaction on c
	ended atomic.Bool
	// keyLocked: the transaction holds the key's advisory lock (DoTx's, from its claim);
	// otherwise commitDoTx takes it before the finish (settledLookup waits for it).
	keyLocked bool
}

// end rolls the transaction back (if it is still open) and releases the connection: the pool
// closes a connection left in a transaction. A txConn may be ended more than once; nil is
// ended already.
func (t *txConn) end(ctx context.Context) {
	if t == nil || t.ended.Swap(true) {
		return
	}
	if t.tx != nil && t.c.Conn().PgConn().TxStatus() != 'I' {
		_ = t.tx.Rollback(context.WithoutCancel(ctx))
	}
	t.c.Release()
}

// aborted reports that a statement failed in t's transaction: it can only roll back.
func (t *txConn) aborted() bool { return t.c.Conn().PgConn().TxStatus() == 'E' }

// fnTx returns the handle DoTx gives fn: t's transaction, which fn cannot end (Commit and
// Rollback fail: DoTx ends it, committing the receipt with fn's writes), and which refuses
// every statement once DoTx has ended it (its connection is back in the pool by then).
func (t *txConn) fnTx() pgx.Tx { return fnTx{t} }

// errTxOwned is what fn gets for ending DoTx's transaction itself.
var errTxOwned = errorf("pgstore: dotx: %w: fn must not commit or roll back DoTx's transaction (DoTx does, with the receipt)", receipts.ErrInvalidArgument)

// fnTx is txConn's transaction as fn sees it. Conn and LargeObjects are pgx's own (they
// cannot be guarded): fn must not keep them beyond its return either.
type fnTx struct{ t *txConn }

func (f fnTx) live() error {
	if f.t.ended.Load() {
		return errorf("pgstore: dotx: %w (used after DoTx's fn returned)", pgx.ErrTxClosed)
	}
	return nil
}

// Begin starts a pseudo nested transaction (a savepoint) in DoTx's transaction.
func (f fnTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := f.live(); err != nil {
		return nil, err
	}
	return f.t.tx.Begin(ctx)
}

// Commit fails: DoTx commits its transaction, with the receipt.
func (f fnTx) Commit(context.Context) error { return errTxOwned }

// Rollback fails: return an error from fn to roll DoTx's transaction back.
func (f fnTx) Rollback(context.Context) error { return errTxOwned }

// CopyFrom is pgx.Tx's, in DoTx's transaction.
func (f fnTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := f.live(); err != nil {
		return 0, err
	}
	return f.t.tx.CopyFrom(ctx, table, cols, src)
}

// SendBatch is pgx.Tx's, in DoTx's transaction.
func (f fnTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := f.live(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return f.t.tx.SendBatch(ctx, b)
}

// LargeObjects is pgx.Tx's, in DoTx's transaction.
func (f fnTx) LargeObjects() pgx.LargeObjects { return f.t.tx.LargeObjects() }

// Prepare is pgx.Tx's, in DoTx's transaction.
func (f fnTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := f.live(); err != nil {
		return nil, err
	}
	return f.t.tx.Prepare(ctx, name, sql)
}

// Exec is pgx.Tx's, in DoTx's transaction.
func (f fnTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := f.live(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return f.t.tx.Exec(ctx, sql, args...)
}

// Query is pgx.Tx's, in DoTx's transaction.
func (f fnTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := f.live(); err != nil {
		return nil, err
	}
	return f.t.tx.Query(ctx, sql, args...)
}

// QueryRow is pgx.Tx's, in DoTx's transaction.
func (f fnTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := f.live(); err != nil {
		return errRow{err}
	}
	return f.t.tx.QueryRow(ctx, sql, args...)
}

// Conn is the connection DoTx's transaction runs on.
func (f fnTx) Conn() *pgx.Conn { return f.t.tx.Conn() }

// errRow is a pgx.Row that fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
