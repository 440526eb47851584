package pebbleengine

import (
	"context"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/machine"
)

// Stats counts the records of the live epochs (a scan, about a second per
// million records) and reports disk usage and the replay cache.
func (e *Engine) Stats(ctx context.Context) (driver.Stats, error) {
	var s driver.Stats
	s.ReplayCacheHits = e.hot.CacheHits.Load()
	s.ReplayCacheEntries, s.ReplayCacheBytes = e.cache.Len()
	s.DiskBytes = e.pdb.Metrics().DiskSpaceUsage()
	now := e.now()
	var rec encoding.Record
	last, seen := uint64(0), false
	err := e.rawRecords(ctx, e.minEpoch.Load(), "", func(ep uint64, _, value []byte) bool {
		if !seen || ep != last {
			s.LiveEpochs++
			last, seen = ep, true
		}
		if err := encoding.DecodeRecordInto(&rec, value); err != nil {
			s.Corrupt++
			return true
		}
		if !machine.Visible(&rec, now, e.retention) {
			s.Expired++
			return true
		}
		switch driver.State(rec.State) {
		case driver.Pending:
			s.Pending++
			if !machine.LeaseLive(&rec, now) {
				s.Abandoned++
			}
		case driver.Succeeded:
			s.Succeeded++
		case driver.Failed:
			s.Failed++
		}
		return true
	})
	return s, err
}
