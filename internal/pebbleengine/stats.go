package pebbleengine

import (
	"context"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/machine"
)

// Stats reports disk usage and the replay cache, from memory.
func (e *Engine) Stats() driver.Stats {
	var s driver.Stats
	s.ReplayCacheHits = e.cacheHits.Load()
	s.ReplayCacheEntries, s.ReplayCacheBytes = e.cache.Len()
	s.DiskBytes = e.pdb.Metrics().DiskSpaceUsage()
	return s
}

// Count counts the records of the live epochs (a scan, about a second per
// million records), durable ones only (rawRecords syncs first).
func (e *Engine) Count(ctx context.Context) (driver.Counts, error) {
	var c driver.Counts
	now := e.now()
	var rec encoding.Record
	last, seen := uint64(0), false
	err := e.rawRecords(ctx, e.minEpoch.Load(), "", func(ep uint64, _, value []byte) bool {
		if !seen || ep != last {
			c.LiveEpochs++
			last, seen = ep, true
		}
		if err := encoding.DecodeRecordInto(&rec, value); err != nil {
			c.Corrupt++
			return true
		}
		if !machine.Visible(&rec, now, e.retention) {
			c.Expired++
			return true
		}
		switch driver.State(rec.State) {
		case driver.Pending:
			c.Pending++
			if !machine.LeaseLive(&rec, now) {
				c.Abandoned++
			}
		case driver.Succeeded:
			c.Succeeded++
		case driver.Failed:
			c.Failed++
		}
		return true
	})
	if err != nil {
		return driver.Counts{}, err
	}
	return c, nil
}
