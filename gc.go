package receipts

import (
	"context"
	"time"
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
	// TombstoneEpochsDropped is how many epochs of tombstone markers were
	// dropped (past Retention + TombstoneWindow), with one range deletion.
	TombstoneEpochsDropped int
	// Writes is how many writes GC issued, whatever the number of records:
	// with tombstones on, one sstable of the dropped records' tombstone
	// markers (ingested first), then, in one synced batch, one range
	// deletion for all the dead epochs, one for the dead epochs of tombstone
	// markers, plus the persisted floor (at most 4).
	Writes int
	// MarkersWritten is how many tombstone markers GC wrote, one for each
	// record it dropped whose tombstone can still be in force, and
	// MarkerBytes the size of the sstable that holds them (Pebble; zero
	// while tombstones are off).
	MarkersWritten int
	MarkerBytes    int64
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

// gc runs the engine's GC and keeps its stats for Stats.
func (db *DB) gc(ctx context.Context) (GCStats, error) {
	ds, err := db.eng.GC(ctx)
	st := GCStats{
		At:                     ds.At,
		EpochsDropped:          ds.EpochsDropped,
		TombstoneEpochsDropped: ds.TombstoneEpochsDropped,
		BytesFreed:             ds.BytesFreed,
		Writes:                 ds.Writes,
		MarkersWritten:         ds.MarkersWritten,
		MarkerBytes:            ds.MarkerBytes,
		Compacted:              ds.Compacted,
		Duration:               ds.Duration,
	}
	if err == nil || st.EpochsDropped > 0 { // dropped, if not compacted
		db.lastGC.Store(&st)
	}
	db.observeGC(ctx, &st, err)
	if err == nil {
		err = db.finishErasures(ctx) // a Keyring destruction an erasure left undone
	}
	return st, err
}

// gcInterval is the background GC period; 0 means disabled.
func (db *DB) gcInterval() time.Duration {
	switch {
	case db.opts.GCInterval < 0:
		return 0
	case db.opts.GCInterval > 0:
		return db.opts.GCInterval
	}
	return min(max(db.opts.EpochWidth, time.Second), time.Hour)
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
