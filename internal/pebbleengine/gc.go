package pebbleengine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// GC drops every epoch whose records are all past retention, with one range
// deletion, every epoch of tombstone markers past Retention +
// TombstoneWindow with another, plus the persisted floor, in one synced
// batch: at most three writes, whatever the number of records.
//
// An epoch e (records last written in [e*W, (e+1)*W), W the epoch width) is
// dead once (e+1)*W + Retention <= now. Writes never land in a dropped epoch,
// even if the clock jumps backwards. If compacting the dropped range fails
// (CompactOnGC), the epochs were dropped all the same: the stats say so
// (EpochsDropped > 0) beside the error.
func (e *Engine) GC(ctx context.Context) (driver.GCStats, error) {
	e.gcMu.Lock()
	defer e.gcMu.Unlock()
	start := time.Now()
	now := e.now()
	st := driver.GCStats{At: e.time(now)}

	// Epochs below newFloor are dead.
	newFloor := uint64(max(now-e.retention, 0) / e.width)
	end := keys.EpochStart(newFloor)
	dropped, first, err := e.countEpochs(ctx, keys.RecordsStart, end, keys.Epoch, keys.EpochStart)
	if err != nil {
		return st, err
	}
	// Tombstone markers below markerFloor are past Retention +
	// TombstoneWindow (with tombstones off, they go with their records).
	markerFloor := newFloor
	if e.window > 0 {
		markerFloor = uint64(max(now-e.retention-e.window, 0) / e.width)
	}
	markerEnd := keys.MarkerEpochStart(markerFloor)
	markersDropped, _, err := e.countEpochs(ctx, keys.MarkersStart, markerEnd, keys.MarkerEpoch, keys.MarkerEpochStart)
	if err != nil {
		return st, err
	}
	if dropped > 0 {
		// From the first epoch still holding records: what earlier GCs
		// dropped may not be reclaimed yet, and is not counted again.
		if st.BytesFreed, err = e.pdb.EstimateDiskUsage(keys.EpochStart(first), end); err != nil {
			st.BytesFreed = 0 // an estimate only
		}
	}
	if dropped > 0 || markersDropped > 0 || newFloor > e.floor.Load() {
		b := e.pdb.NewBatch()
		if dropped > 0 {
			_ = b.DeleteRange(keys.RecordsStart, end, nil)
			st.Writes++
		}
		if markersDropped > 0 {
			_ = b.DeleteRange(keys.MarkersStart, markerEnd, nil)
			st.Writes++
		}
		if newFloor > e.floor.Load() {
			_ = b.Set(keys.GCFloor, encoding.EncodeUint64(newFloor), nil)
			st.Writes++
		}
		err := b.Commit(pebble.Sync)
		_ = b.Close()
		if err != nil {
			return st, fmt.Errorf("receipts: gc: %w", err)
		}
		if newFloor > e.floor.Load() {
			e.floor.Store(newFloor)
		}
		if newFloor > e.minEpoch.Load() {
			e.minEpoch.Store(newFloor)
		}
	}
	if markerFloor > e.markerMin.Load() { // none below now: dropped, or there were none
		e.markerMin.Store(markerFloor)
	}
	st.EpochsDropped, st.TombstoneEpochsDropped = dropped, markersDropped
	e.cache.Sweep(func(updatedAt int64) bool { return machine.Expired(updatedAt, now, e.retention) })
	if dropped > 0 && e.compactOnGC {
		if err := e.pdb.Compact(ctx, keys.RecordsStart, end, true); err != nil {
			st.Duration = time.Since(start)
			return st, fmt.Errorf("receipts: gc: compact: %w", err)
		}
		st.Compacted = true
	}
	if markersDropped > 0 && e.compactOnGC {
		if err := e.pdb.Compact(ctx, keys.MarkersStart, markerEnd, true); err != nil {
			st.Duration = time.Since(start)
			return st, fmt.Errorf("receipts: gc: compact tombstones: %w", err)
		}
		st.Compacted = true
	}
	st.Duration = time.Since(start)
	return st, nil
}

// countEpochs counts the epochs that hold records (or markers: epochOf and
// start parse and build their keys) in [lo, hi), one seek per epoch, and
// returns the first of them. It checks ctx every 64 epochs.
func (e *Engine) countEpochs(ctx context.Context, lo, hi []byte, epochOf func([]byte) (uint64, bool), start func(uint64) []byte) (n int, first uint64, err error) {
	it, err := e.pdb.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, 0, fmt.Errorf("receipts: gc: %w", err)
	}
	defer it.Close()
	for valid := it.First(); valid; {
		if n%64 == 63 {
			if err := ctx.Err(); err != nil {
				return n, first, err
			}
		}
		ep, ok := epochOf(it.Key())
		if !ok {
			return n, first, fmt.Errorf("%w: malformed key %q", driver.ErrCorrupt, it.Key())
		}
		if n == 0 {
			first = ep
		}
		n++
		valid = it.SeekGE(start(ep + 1))
	}
	if err := it.Error(); err != nil {
		return n, first, fmt.Errorf("receipts: gc: %w", err)
	}
	return n, first, nil
}

// epochSpans is the engine's span policy: it ends a span at every epoch
// boundary, and at the start and end of the store's keys. Pebble finishes a
// flush's or compaction's output sstable at each span's end, so no sstable
// holds records of two epochs, or records and other keys; GC's range
// deletion then covers whole sstables, which Pebble's delete-only
// compactions drop without rewriting anything.
//
// A table that starts at a range deletion's bound (shorter than a record
// key) gets no epoch boundary: GC's deletion spans every epoch since 1970,
// and splitting it at each would make millions of sstables.
func epochSpans(start []byte) (pebble.SpanPolicy, []byte, error) {
	switch {
	case bytes.Compare(start, keys.StoreStart) < 0:
		return pebble.SpanPolicy{}, keys.StoreStart, nil
	case bytes.Compare(start, keys.RecordsStart) < 0:
		return pebble.SpanPolicy{}, keys.RecordsStart, nil
	case bytes.Compare(start, keys.RecordsEnd) < 0:
		return epochSpan(start, keys.RecordsStart, keys.RecordsEnd, keys.EpochStart)
	case bytes.Compare(start, keys.MarkersStart) < 0:
		return pebble.SpanPolicy{}, keys.MarkersStart, nil
	case bytes.Compare(start, keys.MarkersEnd) < 0:
		return epochSpan(start, keys.MarkersStart, keys.MarkersEnd, keys.MarkerEpochStart)
	}
	return pebble.SpanPolicy{}, nil, nil
}

// epochSpan ends the span of start, a key in [lo, hi) (records or
// markers), at the next epoch boundary.
func epochSpan(start, lo, hi []byte, epochStart func(uint64) []byte) (pebble.SpanPolicy, []byte, error) {
	if len(start) <= len(lo)+8 { // not a record (marker) key
		return pebble.SpanPolicy{}, hi, nil
	}
	e := binary.BigEndian.Uint64(start[len(lo):])
	if e == math.MaxUint64 {
		return pebble.SpanPolicy{}, hi, nil
	}
	return pebble.SpanPolicy{}, epochStart(e + 1), nil
}
