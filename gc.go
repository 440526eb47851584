package receipts

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// GCStats describes one garbage collection.
type GCStats struct {
	// At is when it ran, by the store's clock.
	At time.Time
	// EpochsDropped is how many epochs holding records were dropped.
	EpochsDropped int
	// BytesFreed estimates the disk space the dropped records took (what
	// Pebble's delete-only compactions will reclaim, or reclaimed at once
	// with CompactOnGC).
	BytesFreed uint64
	// Writes is how many writes GC issued: one range deletion for all the
	// dead epochs plus the persisted floor, whatever the number of records
	// (at most 2, in one synced batch).
	Writes int
	// Compacted reports that the dropped range was compacted at once.
	Compacted bool
	// Duration is how long GC took (wall time).
	Duration time.Duration
}

// GC drops every epoch whose records are all past retention, with one range
// deletion, and returns what it did. Reads never depend on GC: a record past
// retention is invisible whether or not it has been collected. Background GC
// runs every Options.GCInterval unless that is negative.
//
// An epoch e (records last written in [e*W, (e+1)*W), W the epoch width) is
// dead once (e+1)*W + Retention <= now. Writes never land in a dropped epoch,
// even if the clock jumps backwards.
func (db *DB) GC(ctx context.Context) (GCStats, error) {
	if err := db.enter(); err != nil {
		return GCStats{}, err
	}
	defer db.exit()
	if err := ctx.Err(); err != nil {
		return GCStats{}, err
	}
	return db.gc(ctx)
}

func (db *DB) gc(ctx context.Context) (GCStats, error) {
	db.gcMu.Lock()
	defer db.gcMu.Unlock()
	start := time.Now()
	now := db.now()
	st := GCStats{At: unixTime(now, db.loc)}

	// Epochs below newFloor are dead.
	newFloor := uint64(max(now-db.retention, 0) / db.width)
	end := keys.EpochStart(newFloor)
	dropped, first, err := db.countEpochs(ctx, keys.RecordsStart, end)
	if err != nil {
		return st, err
	}
	if dropped > 0 {
		// From the first epoch still holding records: what earlier GCs
		// dropped may not be reclaimed yet, and is not counted again.
		if st.BytesFreed, err = db.pdb.EstimateDiskUsage(keys.EpochStart(first), end); err != nil {
			st.BytesFreed = 0 // an estimate only
		}
	}
	if dropped > 0 || newFloor > db.floor.Load() {
		b := db.pdb.NewBatch()
		if dropped > 0 {
			_ = b.DeleteRange(keys.RecordsStart, end, nil)
			st.Writes++
		}
		if newFloor > db.floor.Load() {
			_ = b.Set(keys.GCFloor, encoding.EncodeUint64(newFloor), nil)
			st.Writes++
		}
		err := b.Commit(pebble.Sync)
		_ = b.Close()
		if err != nil {
			return st, fmt.Errorf("receipts: gc: %w", err)
		}
		if newFloor > db.floor.Load() {
			db.floor.Store(newFloor)
		}
		if newFloor > db.minEpoch.Load() {
			db.minEpoch.Store(newFloor)
		}
	}
	st.EpochsDropped = dropped
	db.cache.Sweep(func(updatedAt int64) bool { return machine.Expired(updatedAt, now, db.retention) })
	if dropped > 0 && db.opts.CompactOnGC {
		if err := db.pdb.Compact(ctx, keys.RecordsStart, end, true); err != nil {
			st.Duration = time.Since(start)
			db.lastGC.Store(&st) // the epochs were dropped all the same
			return st, fmt.Errorf("receipts: gc: compact: %w", err)
		}
		st.Compacted = true
	}
	st.Duration = time.Since(start)
	db.lastGC.Store(&st)
	return st, nil
}

// countEpochs counts the epochs that hold records in [lo, hi), one seek per
// epoch, and returns the first of them. It checks ctx every 64 epochs.
func (db *DB) countEpochs(ctx context.Context, lo, hi []byte) (n int, first uint64, err error) {
	it, err := db.pdb.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: lo, UpperBound: hi})
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
		e, ok := keys.Epoch(it.Key())
		if !ok {
			return n, first, fmt.Errorf("%w: malformed record key %q", ErrCorrupt, it.Key())
		}
		if n == 0 {
			first = e
		}
		n++
		valid = it.SeekGE(keys.EpochStart(e + 1))
	}
	if err := it.Error(); err != nil {
		return n, first, fmt.Errorf("receipts: gc: %w", err)
	}
	return n, first, nil
}

// gcInterval is the background GC period; 0 means disabled.
func (db *DB) gcInterval() time.Duration {
	switch {
	case db.opts.GCInterval < 0:
		return 0
	case db.opts.GCInterval > 0:
		return db.opts.GCInterval
	}
	return min(max(time.Duration(db.width), time.Second), time.Hour)
}

func (db *DB) gcLoop(ctx context.Context, interval time.Duration) {
	defer db.bg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := db.gc(ctx); err != nil && ctx.Err() == nil {
			db.opts.Logger.Error("receipts: background gc", "err", err)
		}
	}
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
	case bytes.Compare(start, keys.RecordsEnd) >= 0:
		return pebble.SpanPolicy{}, nil, nil
	case len(start) <= len(keys.RecordsStart)+8: // not a record key
		return pebble.SpanPolicy{}, keys.RecordsEnd, nil
	}
	e := binary.BigEndian.Uint64(start[len(keys.RecordsStart):])
	if e == math.MaxUint64 {
		return pebble.SpanPolicy{}, keys.RecordsEnd, nil
	}
	return pebble.SpanPolicy{}, keys.EpochStart(e + 1), nil
}
