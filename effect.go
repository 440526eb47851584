package receipts

import (
	"context"
	"fmt"
)

// An Effect writes the application's own data into tx, the engine's unit of
// atomic work, so that it commits with a Succeeded receipt or not at all.
// tx is the engine's own: the batch that carries the receipt on the embedded
// engine (Open, pebblestore: pebblestore.Effect writes one), a pgx.Tx on
// PostgreSQL (pgstore.Open; a transaction that holds the lease's row).
// Write effects with EffectOn, which checks the type; tx is valid only
// while the effect runs.
type Effect func(ctx context.Context, tx any) error

// EffectOn returns an Effect that runs f on an engine whose unit of atomic
// work is a TTx: the Pebble batch on Pebble (pebblestore.Effect is this for
// it), EffectOn(func(ctx context.Context, tx pgx.Tx) error {...}) on
// PostgreSQL. On another engine the effect writes nothing and
// returns an error wrapping ErrUnsupported: the commit it was staged for
// fails, and nothing is recorded.
//
// An effect writes into tx and must not end it: tx's commit is the
// receipt's. An effect that does anyway (a COMMIT or ROLLBACK sent with
// pgx.Tx.Exec, tx.Commit being refused; the Pebble batch's Commit) may have
// made its writes durable without the receipt: the engines detect it after
// the effect returns (PostgreSQL: the connection is no longer in a
// transaction; Pebble: the batch was committed), and the commit fails with
// an error wrapping driver.ErrEffectEnded and ErrOutcomeUnknown, nothing recorded
// and the claim abandoned (the next attempt is Recovered), whatever the
// effect returned. What the engines cannot see is not detected: an effect
// that commits and then begins a new transaction (COMMIT; BEGIN), or
// commits the batch and then resets it, leaves the unit looking untouched,
// and its first writes durable whatever happens next.
func EffectOn[TTx any](f func(ctx context.Context, tx TTx) error) Effect {
	return func(ctx context.Context, tx any) error {
		t, ok := tx.(TTx)
		if !ok {
			return fmt.Errorf("%w: an effect written for %T, on an engine whose unit of work is %T", ErrUnsupported, *new(TTx), tx)
		}
		return f(ctx, t)
	}
}

// Stage adds effect to what commits with this lease's Succeeded receipt:
// Commit (and Run and Do, when fn returns no error) writes the staged
// effects, in the order they were staged, in the engine's unit of atomic
// work together with the receipt, and the receipt and the effects become
// durable together or not at all. A Failed receipt is written without them,
// and Release and Abandon drop them. If an effect returns an error, nothing
// is written and the commit returns that error (Run and Do abandon the
// claim: the outcome is unknown; an effect that panics makes Run and Do
// abandon the claim at once too, and the panic goes on to their caller). A
// commit that fails keeps the effects staged for the next try; one that
// succeeds clears them.
//
// This is how an effect commits with its receipt on every engine;
// pebblestore.DoBatch, RunBatch and CommitWith are the Pebble engine's own
// forms, and pgstore.DoTx and pgstore.CommitTx PostgreSQL's.
func (l *Lease) Stage(effect Effect) {
	if effect == nil {
		return
	}
	l.mu.Lock()
	l.staged = append(l.staged, effect)
	l.mu.Unlock()
}

// stagedEffect returns the staged effects as one Effect, nil if none.
func (l *Lease) stagedEffect() Effect {
	l.mu.Lock()
	list := l.staged
	l.mu.Unlock()
	return joinEffects(list)
}

// joinEffects is list as one effect (nil for none), run in order until one fails.
func joinEffects(list []Effect) Effect {
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return func(ctx context.Context, tx any) error {
		for _, e := range list {
			if err := e(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	}
}

// clearStaged forgets the staged effects: the lease's outcome is recorded.
func (l *Lease) clearStaged() {
	l.mu.Lock()
	l.staged = nil
	l.mu.Unlock()
}
