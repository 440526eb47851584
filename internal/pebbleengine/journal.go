package pebbleengine

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/machine"
)

// Journal implements driver.Journals: the claim's step journal is a field of its Pending
// record (encoding.Record.Journal), rewritten, synced, by one fenced rmw; effect, if not
// nil, writes into the batch that carries it. Every other write of the record copies the
// journal with it (internal/machine), and the replay cache keeps no record that has one.
func (e *Engine) Journal(ctx context.Context, k driver.Key, token uint64, journal []byte,
	effect func(ctx context.Context, tx any) error,
) (driver.Record, error) {
	var b *pebble.Batch
	if effect != nil {
		b = e.pdb.NewBatch()
		defer b.Close()
	}
	next, err := e.fenced(ctx, k, token, b, writeOpts{}, nil, func(cur *encoding.Record, now int64) (*encoding.Record, bool, bool, error) {
		next, ok := machine.Journal(cur, token, journal, now)
		if !ok {
			return nil, false, false, nil // the effect is not applied
		}
		if effect != nil {
			err := effect(ctx, b)
			if batchCommitted(b) {
				ended := fmt.Errorf("receipts: the step's effect: %w: it committed the batch (b.Commit), so its writes are durable without the step's record", driver.ErrEffectEnded)
				if err != nil {
					ended = fmt.Errorf("%w (it returned: %w)", ended, err)
				}
				return nil, false, true, ended
			}
			if err != nil {
				return nil, false, true, fmt.Errorf("receipts: the step's effect: %w", err)
			}
		}
		return next, false, true, nil
	})
	if err != nil {
		return driver.Record{}, err
	}
	return e.record(k, next), nil
}
