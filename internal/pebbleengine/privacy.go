package pebbleengine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"iter"
	"maps"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/keys"
)

// Privacy: the scopes' data keys (driver.DataKeys) and erasure (driver.Eraser).
//
// A data key is stored, as the Keyring wrapped it, under keys.DataKey(scope ID); an erasure
// record under keys.Erasure(scope ID). EraseScope writes, in one synced batch, a range
// deletion of the scope's records in every live epoch and of its markers in every epoch
// that may hold one, the deletion of its data key and its erasure record: a crash leaves
// the scope whole or erased. The erasures in force are also kept in memory (erased), where
// every write of a key checks them under the key lock (rmw), which is what keeps a scope
// erased while claims of it arrive: a claim answers Erased, a fenced write ErrLeaseLost.

var (
	_ driver.DataKeys = (*Engine)(nil)
	_ driver.Eraser   = (*Engine)(nil)
)

// erasedSet maps the ScopeID (as a string) of every scope whose erasure is in force, or
// being written, to its time and end (Unix ns).
type erasedSet map[string]erasedSpan

type erasedSpan struct{ at, until int64 }

// erasedAt reports whether a write of scope at now falls under an erasure, and which. It
// costs one atomic load while no erasure is in force.
func (e *Engine) erasedAt(scope string, now int64) (erasedSpan, bool) {
	m := e.erased.Load()
	if m == nil || len(*m) == 0 {
		return erasedSpan{}, false
	}
	sp, ok := (*m)[string(driver.ScopeID(e.secret, scope))]
	return sp, ok && now < sp.until
}

// loadErasures fills the in-memory set from the erasure records in force at now.
func (e *Engine) loadErasures(now int64) error {
	m := erasedSet{}
	for er, err := range e.scanErasures(context.Background(), false) {
		if err != nil {
			return err
		}
		if now < er.until {
			m[string(er.id)] = erasedSpan{er.at, er.until}
		}
	}
	e.erased.Store(&m)
	return nil
}

// DataKey returns the wrapped data key of the scope named id.
func (e *Engine) DataKey(_ context.Context, id []byte) ([]byte, bool, error) {
	v, closer, err := e.pdb.Get(keys.DataKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("receipts: read a data key: %w", err)
	}
	defer closer.Close()
	return bytes.Clone(v), true, nil
}

// PutDataKey stores wrapped for id, synced, unless a key is stored already.
func (e *Engine) PutDataKey(ctx context.Context, id, wrapped []byte) ([]byte, error) {
	e.keysMu.Lock()
	defer e.keysMu.Unlock()
	cur, found, err := e.DataKey(ctx, id)
	if err != nil || found {
		return cur, err
	}
	if m := e.erased.Load(); m != nil {
		if sp, ok := (*m)[string(id)]; ok && e.now() < sp.until {
			return nil, fmt.Errorf("%w: scope %x", driver.ErrErased, id)
		}
	}
	if err := e.pdb.Set(keys.DataKey(id), wrapped, pebble.Sync); err != nil {
		return nil, fmt.Errorf("receipts: write a data key: %w", err)
	}
	return wrapped, nil
}

// SwapDataKey replaces id's data key old by new, synced, if old is the one stored.
func (e *Engine) SwapDataKey(ctx context.Context, id, old, new []byte) (bool, error) {
	e.keysMu.Lock()
	defer e.keysMu.Unlock()
	cur, found, err := e.DataKey(ctx, id)
	if err != nil || !found || !bytes.Equal(cur, old) {
		return false, err
	}
	if err := e.pdb.Set(keys.DataKey(id), new, pebble.Sync); err != nil {
		return false, fmt.Errorf("receipts: write a data key: %w", err)
	}
	return true, nil
}

// ScanDataKeys yields every stored data key, durable ones only.
func (e *Engine) ScanDataKeys(ctx context.Context) iter.Seq2[driver.DataKey, error] {
	return func(yield func(driver.DataKey, error) bool) {
		it, err := e.pdb.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: keys.DataKeysStart, UpperBound: keys.DataKeysEnd})
		if err != nil {
			yield(driver.DataKey{}, fmt.Errorf("receipts: scan data keys: %w", err))
			return
		}
		defer it.Close()
		if err := e.syncVisible(); err != nil {
			yield(driver.DataKey{}, err)
			return
		}
		for valid := it.First(); valid; valid = it.Next() {
			if err := ctx.Err(); err != nil {
				yield(driver.DataKey{}, err)
				return
			}
			v, err := it.ValueAndErr()
			if err != nil {
				yield(driver.DataKey{}, fmt.Errorf("receipts: scan data keys: %w", err))
				return
			}
			dk := driver.DataKey{ID: bytes.Clone(it.Key()[len(keys.DataKeysStart):]), Wrapped: bytes.Clone(v)}
			if !yield(dk, nil) {
				return
			}
		}
		if err := it.Error(); err != nil {
			yield(driver.DataKey{}, fmt.Errorf("receipts: scan data keys: %w", err))
		}
	}
}

// erasure is an erasure record as stored:
//
//	version (1) | at (8) | until (8) | records (8) | count (4) | flags (1) | CRC-32C of the rest (4)
type erasure struct {
	id           []byte
	at, until    int64
	records      int64
	count        uint32
	keyDestroyed bool
}

const erasureLen = 1 + 8 + 8 + 8 + 4 + 1 + 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (r *erasure) encode() []byte {
	b := make([]byte, 0, erasureLen)
	b = append(b, 1)
	b = binary.BigEndian.AppendUint64(b, uint64(r.at))
	b = binary.BigEndian.AppendUint64(b, uint64(r.until))
	b = binary.BigEndian.AppendUint64(b, uint64(r.records))
	b = binary.BigEndian.AppendUint32(b, r.count)
	var flags byte
	if r.keyDestroyed {
		flags |= 1
	}
	b = append(b, flags)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeErasure(id, v []byte) (erasure, error) {
	if len(v) != erasureLen || v[0] != 1 || binary.BigEndian.Uint32(v[erasureLen-4:]) != crc32.Checksum(v[:erasureLen-4], castagnoli) {
		return erasure{}, fmt.Errorf("%w: erasure record of scope %x", driver.ErrCorrupt, id)
	}
	return erasure{
		id:           bytes.Clone(id),
		at:           int64(binary.BigEndian.Uint64(v[1:])),
		until:        int64(binary.BigEndian.Uint64(v[9:])),
		records:      int64(binary.BigEndian.Uint64(v[17:])),
		count:        binary.BigEndian.Uint32(v[25:]),
		keyDestroyed: v[29]&1 != 0,
	}, nil
}

func (e *Engine) public(r erasure) driver.Erasure {
	return driver.Erasure{ID: r.id, At: e.time(r.at), Until: e.time(r.until), Records: r.records, KeyDestroyed: r.keyDestroyed, Count: r.count}
}

func (e *Engine) getErasure(id []byte) (erasure, bool, error) {
	v, closer, err := e.pdb.Get(keys.Erasure(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return erasure{}, false, nil
	}
	if err != nil {
		return erasure{}, false, fmt.Errorf("receipts: read an erasure record: %w", err)
	}
	defer closer.Close()
	r, err := decodeErasure(id, v)
	return r, err == nil, err
}

// Erasure returns the erasure record of the scope named id.
func (e *Engine) Erasure(_ context.Context, id []byte) (driver.Erasure, bool, error) {
	r, found, err := e.getErasure(id)
	if err != nil || !found {
		return driver.Erasure{}, false, err
	}
	return e.public(r), true, nil
}

// Erasures yields every erasure record, durable ones only.
func (e *Engine) Erasures(ctx context.Context) iter.Seq2[driver.Erasure, error] {
	return func(yield func(driver.Erasure, error) bool) {
		for r, err := range e.scanErasures(ctx, true) {
			if !yield(e.public(r), err) {
				return
			}
		}
	}
}

func (e *Engine) scanErasures(ctx context.Context, durable bool) iter.Seq2[erasure, error] {
	return func(yield func(erasure, error) bool) {
		it, err := e.pdb.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: keys.ErasuresStart, UpperBound: keys.ErasuresEnd})
		if err != nil {
			yield(erasure{}, fmt.Errorf("receipts: scan erasures: %w", err))
			return
		}
		defer it.Close()
		if durable {
			if err := e.syncVisible(); err != nil {
				yield(erasure{}, err)
				return
			}
		}
		for valid := it.First(); valid; valid = it.Next() {
			v, err := it.ValueAndErr()
			if err != nil {
				yield(erasure{}, fmt.Errorf("receipts: scan erasures: %w", err))
				return
			}
			r, err := decodeErasure(it.Key()[len(keys.ErasuresStart):], v)
			if !yield(r, err) {
				return
			}
		}
		if err := it.Error(); err != nil {
			yield(erasure{}, fmt.Errorf("receipts: scan erasures: %w", err))
		}
	}
}

// MarkKeyDestroyed records that the Keyring destroyed the key of id.
func (e *Engine) MarkKeyDestroyed(_ context.Context, id []byte) error {
	e.eraseMu.Lock()
	defer e.eraseMu.Unlock()
	r, found, err := e.getErasure(id)
	if err != nil || !found || r.keyDestroyed {
		return err
	}
	r.keyDestroyed = true
	if err := e.pdb.Set(keys.Erasure(id), r.encode(), pebble.Sync); err != nil {
		return fmt.Errorf("receipts: write an erasure record: %w", err)
	}
	return nil
}

// EraseScope erases scope (driver.Eraser):
//
//  1. the scope's erasure goes into the in-memory set: from here on every write of one of its
//     keys that takes the key lock finds it (rmw) and writes nothing;
//  2. every write of the scope that held its key lock before that is waited for: the lock
//     table lists the keys locked or waited for, and each is locked once;
//  3. one synced batch: a range deletion of the scope's records in every epoch from the
//     oldest live one to the current one, the same for its markers, the deletion of its data
//     key, and its erasure record (with the records it counted in those ranges, on the
//     batch's snapshot: nothing of the scope can be written meanwhile);
//  4. the replay cache and the memo of Pending writes forget everything (entries of the
//     scope would answer from memory, or stand in for a read), and the keys' waiters wake.
//
// If the batch fails, the in-memory set is put back as it was: the scope is whole.
func (e *Engine) EraseScope(ctx context.Context, scope string) (driver.Erasure, error) {
	if e.readOnly {
		return driver.Erasure{}, fmt.Errorf("receipts: erase: the store is open read-only")
	}
	e.eraseMu.Lock()
	defer e.eraseMu.Unlock()
	e.gcMu.Lock() // no epoch is dropped (nor its floor moved) meanwhile
	defer e.gcMu.Unlock()
	id := driver.ScopeID(e.secret, scope)
	prev, found, err := e.getErasure(id)
	if err != nil {
		return driver.Erasure{}, err
	}
	now := e.now()
	rec := erasure{id: id, at: now, until: now + e.retention + max(e.window, 0), count: prev.count + 1, records: prev.records}
	if found && now < prev.until { // in force: erase again, keep its time
		rec = prev // nothing of the scope was written since: its window stands
	}

	// 1. publish
	old := e.erased.Load()
	next := erasedSet{}
	if old != nil {
		next = maps.Clone(*old)
	}
	next[string(id)] = erasedSpan{rec.at, rec.until}
	e.erased.Store(&next)
	ok := false
	defer func() {
		if !ok {
			e.erased.Store(old)
		}
	}()

	// 2. wait for the writes that may not have seen it
	var lk [keys.MaxLockKeyLen]byte
	prefix := keys.AppendLockKey(lk[:0], scope, "")
	for _, key := range e.locks.Keys(prefix) {
		ent, err := e.locks.Lock(ctx, key)
		if err != nil {
			return driver.Erasure{}, err
		}
		ent.Unlock()
	}

	// 3. delete, count, record
	hi := e.epochOf(now)
	b := e.pdb.NewBatch()
	defer b.Close()
	for ep := e.minEpoch.Load(); ep <= hi; ep++ {
		lo, up := keys.ScopeStart(ep, scope), keys.ScopeEnd(ep, scope)
		n, err := countRange(ctx, e.pdb, lo, up)
		if err != nil {
			return driver.Erasure{}, err
		}
		if n > 0 {
			rec.records += n
			if err := b.DeleteRange(lo, up, nil); err != nil {
				return driver.Erasure{}, err
			}
		}
	}
	for ep := min(e.markerMin.Load(), e.minEpoch.Load()); ep <= hi; ep++ {
		lo, up := keys.MarkerScopeStart(ep, scope), keys.MarkerScopeEnd(ep, scope)
		n, err := countRange(ctx, e.pdb, lo, up)
		if err != nil {
			return driver.Erasure{}, err
		}
		if n > 0 {
			if err := b.DeleteRange(lo, up, nil); err != nil {
				return driver.Erasure{}, err
			}
		}
	}
	e.keysMu.Lock()
	defer e.keysMu.Unlock()
	if err := b.Delete(keys.DataKey(id), nil); err != nil {
		return driver.Erasure{}, err
	}
	if err := b.Set(keys.Erasure(id), rec.encode(), nil); err != nil {
		return driver.Erasure{}, err
	}
	if err := e.commitWithClock(b); err != nil {
		return driver.Erasure{}, fmt.Errorf("receipts: erase: %w", err)
	}
	ok = true

	// 4. forget
	e.cache.Sweep(func(int64) bool { return true })
	e.memo.clear()
	e.locks.NotifyAll(prefix)
	return e.public(rec), nil
}

// countRange counts the keys in [lo, hi).
func countRange(ctx context.Context, r pebble.Reader, lo, hi []byte) (int64, error) {
	it, err := r.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, fmt.Errorf("receipts: erase: %w", err)
	}
	var n int64
	for valid := it.First(); valid; valid = it.Next() {
		if n%1024 == 1023 {
			if err := ctx.Err(); err != nil {
				_ = it.Close()
				return 0, err
			}
		}
		n++
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("receipts: erase: %w", err)
	}
	return n, nil
}

var _ driver.Settings = (*Engine)(nil)

// Setting returns the value recorded for name.
func (e *Engine) Setting(_ context.Context, name string) ([]byte, bool, error) {
	v, closer, err := e.pdb.Get(keys.Setting(name))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("receipts: read setting %s: %w", name, err)
	}
	defer closer.Close()
	return bytes.Clone(v), true, nil
}

// PutSetting records value for name, synced, unless a value is recorded.
func (e *Engine) PutSetting(ctx context.Context, name string, value []byte) ([]byte, error) {
	e.keysMu.Lock()
	defer e.keysMu.Unlock()
	if cur, found, err := e.Setting(ctx, name); err != nil || found {
		return cur, err
	}
	if e.readOnly {
		return nil, fmt.Errorf("receipts: record setting %s: the store is open read-only", name)
	}
	if err := e.pdb.Set(keys.Setting(name), value, pebble.Sync); err != nil {
		return nil, fmt.Errorf("receipts: record setting %s: %w", name, err)
	}
	return value, nil
}

// SwapSetting replaces name's value old by new, synced, if old is the one recorded.
func (e *Engine) SwapSetting(ctx context.Context, name string, old, new []byte) (bool, error) {
	e.keysMu.Lock()
	defer e.keysMu.Unlock()
	cur, found, err := e.Setting(ctx, name)
	if err != nil || !found || !bytes.Equal(cur, old) {
		return false, err
	}
	if err := e.pdb.Set(keys.Setting(name), new, pebble.Sync); err != nil {
		return false, fmt.Errorf("receipts: record setting %s: %w", name, err)
	}
	return true, nil
}
