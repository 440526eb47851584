package pebbleengine

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// The fenced writes of a lease's holder. Each is one rmw: it writes nothing
// and returns driver.ErrLeaseLost unless the visible record is Pending with
// the holder's token.

// fenced is rmw for the lease of k with token; decide returns ok=false if
// the lease is lost.
func (e *Engine) fenced(ctx context.Context, k driver.Key, token uint64, b *pebble.Batch, wo writeOpts, sc *rmwScratch,
	decide func(cur *encoding.Record, now int64) (next *encoding.Record, del, ok bool, err error),
) (*encoding.Record, error) {
	var lk [keys.MaxLockKeyLen]byte
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	next, _, err := e.rmw(ctx, k, lockKey, b, wo, sc, func(cur *encoding.Record, now int64) (*encoding.Record, bool, error) {
		next, del, ok, err := decide(cur, now)
		if err == nil && !ok {
			err = fmt.Errorf("%w: token %d", driver.ErrLeaseLost, token)
		}
		return next, del, err
	})
	return next, err
}

// Renew extends the lease to now + ttl. Renewals are not synced: a crash
// ends the lease anyway.
func (e *Engine) Renew(ctx context.Context, k driver.Key, token uint64, ttl time.Duration) (driver.Record, error) {
	next, err := e.fenced(ctx, k, token, nil, unsynced, nil, func(cur *encoding.Record, now int64) (*encoding.Record, bool, bool, error) {
		next, ok := machine.Renew(cur, token, now, int64(ttl))
		return next, false, ok, nil
	})
	if err != nil {
		return driver.Record{}, err
	}
	return e.record(k, next), nil
}

// Finish records state and result, synced before it returns.
func (e *Engine) Finish(ctx context.Context, k driver.Key, token uint64, state driver.State, result []byte) (driver.Record, error) {
	return e.FinishBatch(ctx, k, token, state, result, nil, nil)
}

// FinishBatch is Finish with the receipt written in one synced batch with
// an effect: b, if not nil, already holds it (DoBatch); effect, if not
// nil, writes it into the batch once the lease is known to hold
// (CommitWith). If effect fails, nothing is written and its error is
// returned, wrapped.
func (e *Engine) FinishBatch(ctx context.Context, k driver.Key, token uint64, state driver.State, result []byte,
	b *pebble.Batch, effect func(*pebble.Batch) error,
) (driver.Record, error) {
	if u := unitFor(ctx, token); u != nil && b == nil && state == driver.Succeeded {
		// The application's unit of work (WithUnit): its batch carries the
		// receipt, its effect runs after the staged ones.
		b = u.Batch
		switch {
		case effect == nil:
			effect = u.Effect
		case u.Effect != nil:
			staged, mine := effect, u.Effect
			effect = func(b *pebble.Batch) error {
				if err := staged(b); err != nil {
					return err
				}
				return mine(b)
			}
		}
	}
	if b == nil && effect != nil {
		b = e.pdb.NewBatch()
		defer b.Close()
	}
	sc := scratch() // the finished record is built in sc.next, read into the answer below
	defer sc.release()
	next, err := e.fenced(ctx, k, token, b, notified, sc, func(cur *encoding.Record, now int64) (*encoding.Record, bool, bool, error) {
		next, ok := machine.FinishInto(&sc.next, cur, token, encoding.State(state), result, now)
		if !ok {
			return nil, false, false, nil // the effect is not applied
		}
		next.Trace = bytes.Clone(driver.TraceOf(ctx)) // the finishing call's trace context, if any
		if effect != nil {
			err := effect(b)
			if batchCommitted(b) {
				ended := fmt.Errorf("receipts: the effect: %w: it committed the batch (b.Commit), so its writes are durable without the receipt", driver.ErrEffectEnded)
				if err != nil {
					ended = fmt.Errorf("%w (it returned: %w)", ended, err)
				}
				return nil, false, true, ended
			}
			if err != nil {
				return nil, false, true, fmt.Errorf("receipts: the effect: %w", err)
			}
		}
		if batchCommitted(b) { // DoBatch's or RunBatch's fn committed it
			return nil, false, true, fmt.Errorf("receipts: %w: the batch was committed before the receipt (b.Commit), so its writes are durable without it", driver.ErrEffectEnded)
		}
		return next, false, true, nil
	})
	if err != nil {
		return driver.Record{}, err
	}
	return e.record(k, next), nil
}

// batchCommitted reports whether b was committed already, by the effect or fn that wrote into
// it: Pebble gives a batch its sequence number, and times it, when it commits it. (A batch
// too large for the memtable drops its contents once committed, but is timed still.)
func batchCommitted(b *pebble.Batch) bool {
	return b != nil && (b.CommitStats().TotalDuration != 0 || (b.Count() != 0 && b.SeqNum() != 0))
}

// FinishWith implements driver.Effects: the effect writes into the batch
// that carries the finished record (FinishBatch).
func (e *Engine) FinishWith(ctx context.Context, k driver.Key, token uint64, state driver.State, result []byte,
	effect func(ctx context.Context, tx any) error,
) (driver.Record, error) {
	return e.FinishBatch(ctx, k, token, state, result, nil, func(b *pebble.Batch) error { return effect(ctx, b) })
}

// Release gives the key up, this attempt's effect not having happened
// (machine.Release): a first attempt's record is deleted; after a takeover
// (recovered: the record's Attempts > 1, which machine.Release reads from
// the record itself) the claim is kept, abandoned, so that the next claim
// is Recovered too.
func (e *Engine) Release(ctx context.Context, k driver.Key, token uint64, _ bool) error {
	_, err := e.fenced(ctx, k, token, nil, notified, nil, func(cur *encoding.Record, now int64) (*encoding.Record, bool, bool, error) {
		next, ok := machine.Release(cur, token, now)
		return next, ok && next == nil, ok, nil
	})
	return err
}

// Forget deletes the record, whatever the attempt.
func (e *Engine) Forget(ctx context.Context, k driver.Key, token uint64) error {
	_, err := e.fenced(ctx, k, token, nil, notified, nil, func(cur *encoding.Record, _ int64) (*encoding.Record, bool, bool, error) {
		ok := machine.Forget(cur, token)
		return nil, ok, ok, nil
	})
	return err
}

// Abandon ends the lease at once, keeping the claim.
func (e *Engine) Abandon(ctx context.Context, k driver.Key, token uint64) error {
	_, err := e.fenced(ctx, k, token, nil, notified, nil, func(cur *encoding.Record, now int64) (*encoding.Record, bool, bool, error) {
		next, ok := machine.Abandon(cur, token, now)
		return next, false, ok, nil
	})
	return err
}

// Watch returns a channel closed at the next Finish, Release, Forget or
// Abandon of k in this process (other processes cannot open the store).
func (e *Engine) Watch(k driver.Key) (<-chan struct{}, func()) {
	var lk [keys.MaxLockKeyLen]byte
	w := e.locks.Watch(keys.AppendLockKey(lk[:0], k.Scope, k.ID))
	return w.C, w.Done
}
