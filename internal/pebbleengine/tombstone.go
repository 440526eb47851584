package pebbleengine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"math"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// Tombstones.
//
// A key's tombstone is the time of its newest record (usedAt), kept after
// the record expires and after GC drops it, while machine.Tombstoned(usedAt,
// now, Retention, TombstoneWindow). Nothing is written for it when a record
// is: while an epoch is not dropped, its records are their own tombstones
// (an expired record in a live epoch is what readInto finds; one in a dead
// epoch GC has not dropped yet is probed by tombstone). GC, before it drops
// an epoch's records, writes a marker (keys.AppendMarker, the record's key
// under the markers prefix, holding its UpdatedAt) for each of them, in the
// same epoch, as one sstable ingested into Pebble (ingestMarkers): durable
// before the synced batch that deletes the records and raises the GC floor.
// So at every moment, and in every crash image, a record GC dropped has its
// marker, and one it has not dropped is still there: for an epoch at or
// above the floor (read before the probes' snapshot is taken), the record
// is read first, then the marker (GC may have dropped the epoch since);
// below it, the marker. GC drops markers at epoch end + Retention +
// TombstoneWindow with one range deletion, and writes markers only while
// TombstoneWindow > 0.
//
// A store of format 3 also holds a marker beside each live record, written
// with it. While any marker is left at or above the GC floor when the store
// is opened (liveMarkers), those are deleted with their records when a
// write moves or deletes them (put, and rmw's deletions), so that none is
// left with an older time, or for a key forgotten; they are read only once
// GC has dropped their epoch, and written again by GC (with the same time)
// before it does. A marker GC wrote lies in an epoch it dropped, or was
// about to (a crash before the drop): its record is dead and no write
// touches it.

var _ driver.Tombstones = (*Engine)(nil)

// tombOut receives what rmw found of a tombstone (writeOpts.tomb).
type tombOut struct {
	usedAt int64
	ok     bool
}

// markerBottom is the oldest epoch whose markers can be in force at now:
// a marker of an older epoch e was written before (e+1)*W <= now -
// Retention - TombstoneWindow. It goes by now itself, not by the epoch
// writes land in (epochOf, never below the GC floor: after a restart with
// the clock behind, that is later than now).
func (e *Engine) markerBottom(now int64) uint64 {
	return max(e.markerMin.Load(), uint64(max(now-e.retention-max(e.window, 0), 0)/e.width))
}

// tombstone reports whether k, having no visible record at now, is
// tombstoned, and the time of its last record. rec and stored are what
// readInto found (stored non-nil: rec is an expired record, the newest of
// k); buf is a key buffer.
func (e *Engine) tombstone(ctx context.Context, k driver.Key, now int64, rec *encoding.Record, stored, buf []byte) (usedAt int64, ok bool, err error) {
	if e.window <= 0 {
		return 0, false, nil
	}
	if stored != nil {
		return rec.UpdatedAt, machine.Tombstoned(rec.UpdatedAt, now, e.retention, e.window), nil
	}
	hi := e.epochOf(now)
	lo := e.oldestLiveEpoch(hi) // readInto probed [lo, hi]
	if lo == 0 {
		return 0, false, nil
	}
	bottom := e.markerBottom(now)
	floor := e.floor.Load() // before the prober's snapshot: an epoch below it has its markers in it
	key := keys.AppendMarker(buf[:0], lo, k.Scope, k.ID)
	p := prober{db: e.pdb}
	defer p.closeInto(&err, "read the tombstone")
	for ep := lo - 1; ep >= bottom; ep-- {
		if (lo-1-ep)%probeCheck == probeCheck-1 {
			if err := ctx.Err(); err != nil {
				return 0, false, err
			}
		}
		keys.SetEpoch(key, ep)
		if ep >= floor { // not dropped when the floor was read: the record, if it is still there
			v, found, err := p.get(keys.MarkerOf(key))
			keys.MarkerOf(key) // back to the marker's key
			if err != nil {
				return 0, false, fmt.Errorf("receipts: read the tombstone: %w", err)
			}
			if found {
				if derr := encoding.DecodeRecordInto(rec, v); derr != nil {
					return 0, false, fmt.Errorf("%w: %s: %w", driver.ErrCorrupt, k, derr)
				}
				return rec.UpdatedAt, machine.Tombstoned(rec.UpdatedAt, now, e.retention, e.window), nil
			}
		}
		v, found, err := p.get(key)
		if err != nil {
			return 0, false, fmt.Errorf("receipts: read the tombstone: %w", err)
		}
		if found {
			t, derr := encoding.DecodeUint64(v)
			if derr != nil {
				return 0, false, fmt.Errorf("%w: tombstone of %s: %w", driver.ErrCorrupt, k, derr)
			}
			usedAt = int64(t)
			return usedAt, machine.Tombstoned(usedAt, now, e.retention, e.window), nil
		}
		if ep == 0 {
			break
		}
	}
	return 0, false, nil
}

// deleteMarker adds the deletion of the marker that goes with the record
// key stored to b, if the store may hold one (liveMarkers).
func (e *Engine) deleteMarker(b *pebble.Batch, stored []byte) error {
	if !e.liveMarkers {
		return nil
	}
	bp := keyBufs.Get().(*[]byte)
	defer keyBufs.Put(bp)
	mk := keys.MarkerOf(append((*bp)[:0], stored...))
	err := b.Delete(mk, nil)
	*bp = mk[:0]
	return err
}

// Tombstone returns k's tombstone, read under k's lock.
func (e *Engine) Tombstone(ctx context.Context, k driver.Key) (driver.Tombstone, bool, error) {
	var lk [keys.MaxLockKeyLen]byte
	var out tombOut
	_, _, err := e.rmw(ctx, k, keys.AppendLockKey(lk[:0], k.Scope, k.ID), nil, writeOpts{tomb: &out, read: true}, nil,
		func(*encoding.Record, int64) (*encoding.Record, bool, error) { return nil, false, nil })
	if err != nil || !out.ok {
		return driver.Tombstone{}, false, err
	}
	return e.tombstoneOf(k, out.usedAt), true, nil
}

// tombstoneOf is the tombstone of k whose record was last written at usedAt.
func (e *Engine) tombstoneOf(k driver.Key, usedAt int64) driver.Tombstone {
	return driver.Tombstone{
		Key:       k,
		UsedAt:    e.time(usedAt),
		ExpiredAt: e.time(usedAt + e.retention),
		Until:     e.time(satAdd(usedAt, e.retention+max(e.window, 0))),
	}
}

// satAdd is t + d, saturated at MaxInt64.
func satAdd(t, d int64) int64 {
	if t > math.MaxInt64-d {
		return math.MaxInt64
	}
	return t + d
}

// ScanTombstones yields the tombstones in force (scope "" = every scope),
// oldest epoch first: from the markers of the epochs GC dropped and the
// expired records of the others (tombstone.go), read on one snapshot taken
// after the GC floor is read. Each is checked against a fresh read of its
// key.
func (e *Engine) ScanTombstones(ctx context.Context, scope string, limit int) iter.Seq2[driver.Tombstone, error] {
	return func(yield func(driver.Tombstone, error) bool) {
		if e.window <= 0 {
			return
		}
		now := e.now()
		bottom := e.markerBottom(now)
		floor := e.floor.Load() // before the snapshot: an epoch below it has its markers in it
		snap := e.pdb.NewSnapshot()
		defer snap.Close()
		mit, err := snap.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: keys.MarkerEpochStart(bottom), UpperBound: keys.MarkersEnd})
		if err != nil {
			yield(driver.Tombstone{}, fmt.Errorf("receipts: scan tombstones: %w", err))
			return
		}
		defer mit.Close()
		rit, err := snap.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: keys.EpochStart(max(bottom, floor)), UpperBound: keys.RecordsEnd})
		if err != nil {
			yield(driver.Tombstone{}, fmt.Errorf("receipts: scan tombstones: %w", err))
			return
		}
		defer rit.Close()
		if err := e.syncVisible(); err != nil {
			yield(driver.Tombstone{}, err)
			return
		}
		var rec encoding.Record
		n := 0
		mok, rok := mit.First(), rit.First()
		for mok || rok {
			if err := ctx.Err(); err != nil {
				yield(driver.Tombstone{}, err)
				return
			}
			var k driver.Key
			var usedAt int64
			var err error
			if mok && (!rok || markerEpochOf(mit.Key()) <= recordEpochOf(rit.Key())) { // the older epoch first
				k, usedAt, err = e.scannedMarker(snap, mit, floor)
				mok = mit.Next()
			} else {
				k, usedAt, err = scannedRecord(rit, &rec)
				rok = rit.Next()
			}
			if err != nil {
				if !yield(driver.Tombstone{}, err) {
					return
				}
				continue
			}
			if k == (driver.Key{}) || (scope != "" && k.Scope != scope) {
				continue
			}
			if !machine.Tombstoned(usedAt, now, e.retention, e.window) || !machine.Expired(usedAt, now, e.retention) {
				continue
			}
			// The newest record of k decides (a marker or record of an
			// older generation, or one whose key has a visible record, is
			// not a tombstone): the same check a claim makes.
			cur, found, err := e.tombstoneNow(ctx, k, now)
			if err != nil {
				if !yield(driver.Tombstone{}, err) {
					return
				}
				continue
			}
			if !found || cur != usedAt {
				continue
			}
			if !yield(e.tombstoneOf(k, usedAt), nil) {
				return
			}
			if n++; limit > 0 && n >= limit {
				return
			}
		}
		for _, it := range []*pebble.Iterator{mit, rit} {
			if err := it.Error(); err != nil {
				yield(driver.Tombstone{}, fmt.Errorf("receipts: scan tombstones: %w", err))
				return
			}
		}
	}
}

// markerEpochOf and recordEpochOf are a key's epoch (MaxUint64 if
// malformed: it sorts last, and is reported when its turn comes).
func markerEpochOf(key []byte) uint64 {
	ep, ok := keys.MarkerEpoch(key)
	if !ok {
		return math.MaxUint64
	}
	return ep
}

func recordEpochOf(key []byte) uint64 {
	ep, ok := keys.Epoch(key)
	if !ok {
		return math.MaxUint64
	}
	return ep
}

// scannedMarker is the key and time of the marker at it. A marker of an
// epoch at or above floor whose record is beside it on snap (a store of
// format 3, a GC under way) is skipped (a zero key): the record is scanned.
func (e *Engine) scannedMarker(snap *pebble.Snapshot, it *pebble.Iterator, floor uint64) (driver.Key, int64, error) {
	ep, s, id, err := keys.ParseMarker(it.Key())
	if err != nil {
		return driver.Key{}, 0, fmt.Errorf("%w: marker key %q: %w", driver.ErrCorrupt, it.Key(), err)
	}
	k := driver.Key{Scope: s, ID: id}
	if ep >= floor {
		_, closer, err := snap.Get(keys.MarkerOf(bytes.Clone(it.Key())))
		switch {
		case err == nil:
			_ = closer.Close()
			return driver.Key{}, 0, nil
		case !errors.Is(err, pebble.ErrNotFound):
			return driver.Key{}, 0, fmt.Errorf("receipts: scan tombstones: %w", err)
		}
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return driver.Key{}, 0, fmt.Errorf("receipts: scan tombstones: %w", err)
	}
	t, err := encoding.DecodeUint64(v)
	if err != nil {
		return driver.Key{}, 0, fmt.Errorf("%w: tombstone of %s: %w", driver.ErrCorrupt, k, err)
	}
	return k, int64(t), nil
}

// scannedRecord is the key and time of the record at it, decoded into rec.
func scannedRecord(it *pebble.Iterator, rec *encoding.Record) (driver.Key, int64, error) {
	_, s, id, err := keys.ParseRecord(it.Key())
	if err != nil {
		return driver.Key{}, 0, fmt.Errorf("%w: record key %q: %w", driver.ErrCorrupt, it.Key(), err)
	}
	k := driver.Key{Scope: s, ID: id}
	v, err := it.ValueAndErr()
	if err != nil {
		return driver.Key{}, 0, fmt.Errorf("receipts: scan tombstones: %w", err)
	}
	if err := encoding.DecodeRecordInto(rec, v); err != nil {
		return driver.Key{}, 0, fmt.Errorf("%w: %s: %w", driver.ErrCorrupt, k, err)
	}
	return k, rec.UpdatedAt, nil
}

// tombstoneNow reads k (without its lock: for reporting only) and returns
// the time of its tombstone in force at now, found false if none.
func (e *Engine) tombstoneNow(ctx context.Context, k driver.Key, now int64) (int64, bool, error) {
	var rec encoding.Record
	bp := keyBufs.Get().(*[]byte)
	defer keyBufs.Put(bp)
	visible, stored, _, err := e.readInto(ctx, k, now, &rec, *bp)
	if err != nil || visible {
		return 0, false, err
	}
	var buf []byte
	if stored == nil {
		buf = *bp
	}
	usedAt, ok, err := e.tombstone(ctx, k, now, &rec, stored, buf)
	return usedAt, ok, err
}

// markersFrom reports whether a marker lives in epoch floor or later.
func (e *Engine) markersFrom(floor uint64) (bool, error) {
	it, err := e.pdb.NewIter(&pebble.IterOptions{LowerBound: keys.MarkerEpochStart(floor), UpperBound: keys.MarkersEnd})
	if err != nil {
		return false, fmt.Errorf("receipts: open iterator: %w", err)
	}
	defer it.Close()
	found := it.First()
	return found, it.Error()
}

// firstMarkerEpoch returns the oldest epoch holding markers.
func (e *Engine) firstMarkerEpoch() (uint64, bool, error) {
	it, err := e.pdb.NewIter(&pebble.IterOptions{LowerBound: keys.MarkersStart, UpperBound: keys.MarkersEnd})
	if err != nil {
		return 0, false, fmt.Errorf("receipts: open iterator: %w", err)
	}
	defer it.Close()
	if !it.First() {
		return 0, false, it.Error()
	}
	ep, ok := keys.MarkerEpoch(it.Key())
	if !ok {
		return 0, false, fmt.Errorf("%w: malformed marker key %q", driver.ErrCorrupt, it.Key())
	}
	return ep, true, nil
}
