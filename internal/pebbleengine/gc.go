package pebbleengine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/internal/mutate"
)

// GC drops every epoch whose records are all past retention, with one range
// deletion, every epoch of tombstone markers past Retention +
// TombstoneWindow with another, plus the persisted floor, in one synced
// batch. With tombstones on, it first writes the markers of the records it
// is about to drop (ingestMarkers: one sstable, read from those epochs in
// order), durable before that batch: at most four writes, whatever the
// number of records.
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
	if dropped > 0 && e.window > 0 && mutate.Name != mutate.NoGCMarkers {
		// The markers first, durable before the records go (tombstone.go):
		// those of the epochs whose tombstones can still be in force.
		n, size, err := e.ingestMarkers(ctx, max(first, markerFloor), newFloor)
		if err != nil {
			return st, err
		}
		if n > 0 {
			st.Writes++
			st.MarkersWritten, st.MarkerBytes = n, size
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

// gcMarkersFile is the prefix of the sstables GC writes markers into, in
// the store's directory, before Pebble ingests them (and links them under
// names of its own).
const gcMarkersFile = "receipts-gc-markers-"

// removeMarkerFiles removes the marker sstables a GC left when it was cut
// short before Pebble ingested them (a crash): nothing refers to them.
func (e *Engine) removeMarkerFiles() {
	names, err := e.po.FS.List(e.dir)
	if err != nil {
		return
	}
	for _, name := range names {
		if strings.HasPrefix(name, gcMarkersFile) {
			_ = e.po.FS.Remove(e.po.FS.PathJoin(e.dir, name))
		}
	}
}

// ingestMarkers writes a tombstone marker for every record of the epochs
// [lo, hi), under the same key in the markers prefix (same epoch), holding
// the record's UpdatedAt, and ingests them into Pebble in one call: one
// write, atomic, durable when it returns (Pebble syncs the tables and its
// manifest). One sstable per epoch, as Pebble's own flushes and compactions
// split them (epochSpans), so that the range deletion that drops an epoch
// of markers later covers whole tables. The records are read in key order,
// which is the markers' order, with one iterator; nothing else writes
// those epochs (they are dead: no write lands there). A record that does
// not decode gets a marker at its epoch's last instant, the latest its last
// write can have been: its key stays refused at least as long as it should.
// It returns the markers written and the tables' size.
func (e *Engine) ingestMarkers(ctx context.Context, lo, hi uint64) (n int, size int64, err error) {
	if lo >= hi {
		return 0, 0, nil
	}
	if e.readOnly { // as the batch that drops the records would fail
		return 0, 0, fmt.Errorf("receipts: gc: %w", pebble.ErrReadOnly)
	}
	it, err := e.pdb.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: keys.EpochStart(lo), UpperBound: keys.EpochStart(hi)})
	if err != nil {
		return 0, 0, fmt.Errorf("receipts: gc: markers: %w", err)
	}
	defer it.Close()
	fs := e.po.FS
	var paths []string
	defer func() {
		for _, p := range paths {
			_ = fs.Remove(p) // Pebble has linked (or copied) them by then
		}
	}()
	var w *sstable.Writer // the current epoch's table
	defer func() {
		if w != nil {
			_ = w.Close()
		}
	}()
	finish := func() error {
		err := w.Close() // finishes the table: written and synced
		w = nil
		return err
	}
	var rec encoding.Record
	var mk, val []byte
	cur := uint64(0)
	for valid := it.First(); valid; valid = it.Next() {
		if n%4096 == 4095 {
			if err := ctx.Err(); err != nil {
				return 0, 0, err
			}
		}
		key := it.Key()
		ep, ok := keys.Epoch(key)
		if !ok {
			return 0, 0, fmt.Errorf("%w: malformed record key %q", driver.ErrCorrupt, key)
		}
		if w == nil || ep != cur {
			if w != nil {
				if err := finish(); err != nil {
					return 0, 0, fmt.Errorf("receipts: gc: markers: %w", err)
				}
			}
			path := fs.PathJoin(e.dir, gcMarkersFile+strconv.FormatUint(ep, 10)+".sst")
			f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
			if err != nil {
				return 0, 0, fmt.Errorf("receipts: gc: markers: %w", err)
			}
			paths = append(paths, path)
			w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), e.po.MakeWriterOptions(0, e.pdb.TableFormat()))
			cur = ep
		}
		usedAt := int64(ep+1)*e.width - 1
		if v, err := it.ValueAndErr(); err != nil {
			return 0, 0, fmt.Errorf("receipts: gc: markers: %w", err)
		} else if encoding.DecodeRecordInto(&rec, v) == nil {
			usedAt = rec.UpdatedAt
		}
		mk = keys.MarkerOf(append(mk[:0], key...))
		val = encoding.AppendUint64(val[:0], uint64(usedAt))
		if err := w.Set(mk, val); err != nil {
			return 0, 0, fmt.Errorf("receipts: gc: markers: %w", err)
		}
		n++
	}
	if err := it.Error(); err != nil {
		return 0, 0, fmt.Errorf("receipts: gc: markers: %w", err)
	}
	if w != nil {
		if err := finish(); err != nil {
			return 0, 0, fmt.Errorf("receipts: gc: markers: %w", err)
		}
	}
	if n == 0 {
		return 0, 0, nil
	}
	for _, p := range paths {
		if st, err := fs.Stat(p); err == nil {
			size += st.Size()
		}
	}
	if err := e.pdb.Ingest(ctx, paths); err != nil {
		return 0, 0, fmt.Errorf("receipts: gc: ingest markers: %w", err)
	}
	return n, size, nil
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
