package pebbleengine

import (
	"context"
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
// Every write of a record (claim, renewal, takeover, commit, abandon) also
// writes the key's marker (keys.AppendMarker) in the same batch, in the
// same epoch, holding the record's UpdatedAt; the write that moves a record
// to a newer epoch deletes the old epoch's marker with the old record, and
// the deletion of a record (a first attempt released, a Forget) deletes
// its marker. So, for every epoch GC has not dropped, a key has a marker
// in an epoch exactly when it has a record there, with the same time.
// GC drops records at epoch end + Retention and markers at epoch end +
// Retention + TombstoneWindow, each with one range deletion.
//
// A key without a visible record is tombstoned while
// machine.Tombstoned(usedAt, now, Retention, TombstoneWindow), usedAt
// being the time of its newest record: the expired record itself if a
// lookup finds one in the live epochs, or else the newest marker in the
// older epochs (by the invariant above, the live epochs hold no marker
// without its record). Tombstones are written only while TombstoneWindow
// > 0; the deletions that keep the invariant always are.

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

// putMarker adds k's marker for a record last written at usedAt, in epoch,
// to b (nothing while tombstones are off).
func (e *Engine) putMarker(b *pebble.Batch, k driver.Key, epoch uint64, usedAt int64) error {
	if e.window <= 0 {
		return nil
	}
	bp := keyBufs.Get().(*[]byte)
	defer keyBufs.Put(bp)
	mk := keys.AppendMarker((*bp)[:0], epoch, k.Scope, k.ID)
	mk = encoding.AppendUint64(mk, uint64(usedAt))
	n := len(mk) - 12
	err := b.Set(mk[:n], mk[n:], nil)
	*bp = mk[:0]
	return err
}

// deleteMarker adds the deletion of the marker that goes with the record
// key stored to b.
func deleteMarker(b *pebble.Batch, stored []byte) error {
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
	_, _, err := e.rmw(ctx, k, keys.AppendLockKey(lk[:0], k.Scope, k.ID), nil, writeOpts{tomb: &out},
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
// oldest epoch first, from the markers of the epochs older than the live
// ones; each is checked against a fresh read of its key.
func (e *Engine) ScanTombstones(ctx context.Context, scope string, limit int) iter.Seq2[driver.Tombstone, error] {
	return func(yield func(driver.Tombstone, error) bool) {
		if e.window <= 0 {
			return
		}
		now := e.now()
		bottom := e.markerBottom(now)
		it, err := e.pdb.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: keys.MarkerEpochStart(bottom), UpperBound: keys.MarkersEnd})
		if err != nil {
			yield(driver.Tombstone{}, fmt.Errorf("receipts: scan tombstones: %w", err))
			return
		}
		defer it.Close()
		if err := e.syncVisible(); err != nil {
			yield(driver.Tombstone{}, err)
			return
		}
		n := 0
		for valid := it.First(); valid; valid = it.Next() {
			if err := ctx.Err(); err != nil {
				yield(driver.Tombstone{}, err)
				return
			}
			_, s, id, kerr := keys.ParseMarker(it.Key())
			if kerr != nil {
				if !yield(driver.Tombstone{}, fmt.Errorf("%w: marker key %q: %w", driver.ErrCorrupt, it.Key(), kerr)) {
					return
				}
				continue
			}
			if scope != "" && s != scope {
				continue
			}
			k := driver.Key{Scope: s, ID: id}
			v, err := it.ValueAndErr()
			var t uint64
			if err == nil {
				t, err = encoding.DecodeUint64(v)
				if err != nil {
					err = fmt.Errorf("%w: tombstone of %s: %w", driver.ErrCorrupt, k, err)
				}
			}
			if err != nil {
				if !yield(driver.Tombstone{}, err) {
					return
				}
				continue
			}
			usedAt := int64(t)
			if !machine.Tombstoned(usedAt, now, e.retention, e.window) || !machine.Expired(usedAt, now, e.retention) {
				continue
			}
			// The newest record of k decides (a marker of an older
			// generation, or one whose record is still visible, is not a
			// tombstone): the same check a claim makes.
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
		if err := it.Error(); err != nil {
			yield(driver.Tombstone{}, fmt.Errorf("receipts: scan tombstones: %w", err))
		}
	}
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

// migrateMarkers writes a marker for every record of a store of a format
// before tombstones (in batches, unsynced: the meta record written after
// them is synced, and the WAL is synced in order).
func (e *Engine) migrateMarkers() error {
	if e.window <= 0 {
		return nil
	}
	it, err := e.pdb.NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	if err != nil {
		return fmt.Errorf("receipts: migrate: %w", err)
	}
	defer it.Close()
	b := e.pdb.NewBatch()
	defer func() { _ = b.Close() }()
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("receipts: migrate: %w", err)
		}
		rec, derr := encoding.DecodeRecord(v)
		if derr != nil {
			continue // reported as corrupt on every read; never read as absent
		}
		mk := keys.MarkerOf(append([]byte(nil), it.Key()...))
		if err := b.Set(mk, encoding.EncodeUint64(uint64(rec.UpdatedAt)), nil); err != nil {
			return err
		}
		if b.Len() > 1<<20 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return fmt.Errorf("receipts: migrate: %w", err)
			}
			_ = b.Close()
			b = e.pdb.NewBatch()
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("receipts: migrate: %w", err)
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("receipts: migrate: %w", err)
	}
	return nil
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
