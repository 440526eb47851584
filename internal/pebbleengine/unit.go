package pebbleengine

import (
	"context"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/peek"
)

// Unit is the application's share of one attempt's unit of atomic work:
// a batch it fills while the attempt runs (pebblestore.DoBatch and
// RunBatch), or an effect to write once the lease is known to hold
// (pebblestore.CommitWith). It travels to the engine in the call's context
// (WithUnit), so the engine-neutral root never names a Pebble type: the
// finish of a Succeeded receipt for the unit's lease (Bind) commits the
// receipt in the unit's very batch, with the effect, in one synced write.
// A Failed receipt, a release or an abandon ignore it.
type Unit struct {
	// Batch, if not nil, already holds the application's writes; the
	// receipt is added to it and it is committed (synced). Nil: the engine
	// uses a batch of its own.
	Batch *pebble.Batch
	// Effect, if not nil, writes into the batch after the lease's fence
	// has held; its error writes nothing and is returned, wrapped.
	Effect func(*pebble.Batch) error

	token uint64 // the lease the unit belongs to (Bind); 0 while claiming
}

type unitKey struct{}

// WithUnit returns ctx carrying u. While u is not bound, a claim made with
// ctx is not synced: it guards only the writes in u's batch, which commit
// synced with the receipt, and a crash loses the claim together with them
// (one fsync per operation). Bind u to the lease as soon as it is known, so
// that claims of other keys made with a context derived from ctx (nested
// calls in the attempt) are synced as usual.
func WithUnit(ctx context.Context, u *Unit) context.Context {
	return context.WithValue(ctx, unitKey{}, u)
}

// Bind ties u to the lease with token: only that lease's finish commits u.
func (u *Unit) Bind(token uint64) { u.token = token }

// unitFor returns ctx's unit if it belongs to the lease with token.
func unitFor(ctx context.Context, token uint64) *Unit {
	if u, ok := ctx.Value(unitKey{}).(*Unit); ok && u.token == token {
		return u
	}
	return nil
}

// claimUnsynced reports whether a claim made with ctx guards only an
// unbound unit's batch (WithUnit).
func claimUnsynced(ctx context.Context) bool {
	u, ok := ctx.Value(unitKey{}).(*Unit)
	return ok && u.token == 0
}

// Of returns the Pebble engine a store runs on, nil if it runs on another.
// x is a *receipts.DB (anything with its Driver method).
func Of(x any) *Engine {
	d, ok := x.(interface{ Driver() driver.Engine })
	if !ok {
		return nil
	}
	e, _ := d.Driver().(*Engine)
	return e
}

func init() {
	// The module's harnesses and benchmarks read a store's Pebble database
	// without turning its memory answers off (Engine.Peek): Pebble's own
	// internal/private pattern, set wherever the engine is linked.
	peek.Pebble = func(x any) *pebble.DB {
		if e := Of(x); e != nil {
			return e.Peek()
		}
		return nil
	}
}
