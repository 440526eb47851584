package pebbleengine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/internal/mutate"
	"github.com/receiptstore/receipts/internal/rcache"
)

// Lookup returns the visible record of k in any state: through the replay
// cache, or read under k's lock (and then remembered if finished).
func (e *Engine) Lookup(ctx context.Context, k driver.Key) (driver.Record, bool, time.Time, error) {
	var lk [keys.MaxLockKeyLen]byte
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	now := e.now()
	if res, ok := e.fromCache(ctx, k, lockKey, nil, now); ok {
		return res.Record, true, res.Now, nil
	}
	var rec driver.Record
	found := false
	_, now, err := e.rmw(ctx, k, lockKey, nil, writeOpts{read: true}, nil, func(cur *encoding.Record, _ int64) (*encoding.Record, bool, error) {
		if cur != nil { // a copy: cur may alias the memo's bytes (readMemo)
			rec, found = e.recordCopy(k, cur), true
		}
		return nil, false, nil
	})
	if err != nil {
		return driver.Record{}, false, time.Time{}, err
	}
	return rec, found, e.time(now), nil
}

// oldestLiveEpoch is the oldest epoch a lookup at epoch hi probes:
// hi - ceil(Retention/W). That covers every record written within Retention
// (epochOf(now - Retention) is never older), and it guarantees that a copy a
// write did not see, in an older epoch, had expired by the start of epoch hi:
// the store's clock never restarts before the start of the newest epoch on
// disk, so such a copy can never come back to life. When W divides
// Retention (the default, W = Retention/4) the two bounds are the same.
func (e *Engine) oldestLiveEpoch(hi uint64) uint64 {
	back := uint64((e.retention + e.width - 1) / e.width)
	lo := e.minEpoch.Load()
	if hi > back {
		lo = max(lo, hi-back)
	}
	return lo
}

// keyBufs holds record-key buffers for readInto.
var keyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 128); return &b }}

// probeCheck is how many epochs a lookup probes between checks of its
// context.
const probeCheck = 64

// readInto reads the visible record of k at now into rec, building keys in
// buf (stored aliases it), and returns the key it is stored under and the
// bytes stored (raw, right after stored in the same buffer: for the replay
// cache, which then describes exactly what Pebble holds). found is false if
// there is no visible record; stored may still name an expired one (to
// delete with the next write). Read errors are returned as errors, never as
// "absent"; undecodable bytes as ErrCorrupt. It checks ctx every probeCheck
// epochs.
//
// REQUIRES: k's lock held, for anything that writes based on the result.
func (e *Engine) readInto(ctx context.Context, k driver.Key, now int64, rec *encoding.Record, buf []byte) (found bool, stored, raw []byte, err error) {
	hi := e.epochOf(now)
	lo := e.oldestLiveEpoch(hi)
	key := keys.AppendRecord(buf[:0], hi, k.Scope, k.ID)
	p := prober{db: e.pdb}
	defer p.closeInto(&err, "read the record")
	for ep := hi; ; ep-- {
		if (hi-ep)%probeCheck == probeCheck-1 {
			if err := ctx.Err(); err != nil {
				return false, nil, nil, err
			}
		}
		keys.SetEpoch(key, ep)
		v, ok, err := p.get(key)
		if err != nil {
			return false, nil, nil, fmt.Errorf("receipts: read the record: %w", err)
		}
		if ok {
			if derr := encoding.DecodeRecordInto(rec, v); derr != nil {
				return false, nil, nil, fmt.Errorf("%w: %s: %w", driver.ErrCorrupt, k, derr)
			}
			b := append(key, v...)
			return machine.Visible(rec, now, e.retention), b[:len(key)], b[len(key):len(b):len(b)], nil
		}
		if ep <= lo {
			return false, nil, nil, nil
		}
	}
}

// fromCache answers a claim of k with fingerprint fp (nil: a Lookup) at now
// through the replay cache. ok is false otherwise, for the uncached way to
// decide. The outcome is Replay (with a record of the caller's own) or
// Mismatch. It needs no key lock: only synced records are cached, so what
// it answers is durable.
//
// An entry holding the record's bytes (Entry.Val) answers from memory,
// without reading Pebble, if fromMemory allows. That is safe because a
// finished, synced record never changes while it is visible (no rule of
// internal/machine rewrites a finished record before it expires), and
// every write of a record goes through rmw, which deletes the key's entry
// under the key lock before it writes; GC drops records only with whole
// epochs, which the entry's epoch is checked against; and writes of the
// store's keys by anyone else need the raw Pebble handle, whose handing out
// (DB) turns this off.
//
// Otherwise it probes the epochs exactly as readInto does, and answers
// only if the newest record found is the cached one: intact, under the
// cached epoch, with the cached checksum. A cancelled ctx makes it give up
// (ok false; the uncached way reports it).
//
// Both ways build the answer with answer, from the entry and the bytes.
func (e *Engine) fromCache(ctx context.Context, k driver.Key, lockKey, fp []byte, now int64) (res driver.ClaimResult, ok bool) {
	entry, found := e.cache.Get(lockKey)
	ent := &entry
	if !found || (machine.Expired(ent.UpdatedAt, now, e.retention) && mutate.Name != mutate.StaleCache) {
		return res, false
	}
	hi := e.epochOf(now)
	if ent.Val != nil && e.fromMemory(ent, now, hi) {
		if res, ok = e.answer(k, ent, ent.Val, fp, now, true); ok {
			e.cacheHits.Add(1)
		}
		return res, ok
	}
	key := ent.Key
	if hi != ent.Epoch { // the newer epochs must not hold a record
		bp := keyBufs.Get().(*[]byte)
		defer keyBufs.Put(bp)
		key = keys.AppendRecord((*bp)[:0], hi, k.Scope, k.ID)
		*bp = key[:0]
	}
	p := prober{db: e.pdb} // the newer epochs' probes, of keys that must be absent
	defer func() { _ = p.close() }()
	for ep := hi; ; ep-- {
		if (hi-ep)%probeCheck == probeCheck-1 && ctx.Err() != nil {
			return res, false
		}
		if ep != ent.Epoch {
			keys.SetEpoch(key, ep)
			if _, found, err := p.get(key); err != nil || found {
				return res, false // a newer record of k, or no way to know
			}
			if ep <= ent.Epoch || ep <= e.oldestLiveEpoch(hi) {
				return res, false
			}
			continue
		}
		v, closer, err := e.pdb.Get(ent.Key)
		if err != nil {
			return res, false
		}
		if ent.Matches(v) {
			res, ok = e.answer(k, ent, v, fp, now, false)
		}
		_ = closer.Close()
		if ok {
			e.cacheHits.Add(1)
		}
		return res, ok
	}
}

// fromMemory reports whether ent, which holds its record's bytes and is
// unexpired at now, may answer at now (hi = epochOf(now)) without reading
// Pebble: the raw Pebble handle was never handed out (DB), Close has not
// begun, and the record is where a read at now finds it: written no later
// than now, in an epoch a lookup at now probes (not dropped by GC, not
// newer than now's). Nothing newer of the key is stored: a write deletes
// the entry first (rmw).
func (e *Engine) fromMemory(ent *rcache.Entry, now int64, hi uint64) bool {
	return (!e.rawDB.Load() || mutate.Name == mutate.CacheRaw) && !e.closing() && ent.UpdatedAt <= now &&
		ent.Epoch <= hi && ent.Epoch >= e.oldestLiveEpoch(hi)
}

// answer is fromCache's answer to a claim of k with fingerprint fp (nil: a
// Lookup) at now, from ent and v, the record's bytes (ent.Matches(v)):
// Replay or Mismatch. ok is false for any other outcome (none, for a
// finished record). The record's fingerprint and result are copies, unless
// v is immutable (kept: ent.Val) and this is a claim: they then alias v,
// and the result is Shared (the root copies them, with its receipt, in one
// allocation).
func (e *Engine) answer(k driver.Key, ent *rcache.Entry, v, fp []byte, now int64, kept bool) (res driver.ClaimResult, ok bool) {
	rec := ent.View(v)
	if !machine.Visible(&rec, now, e.retention) && mutate.Name != mutate.StaleCache {
		return res, false // the visibility test of readInto, exactly
	}
	out := machine.Replay
	if fp != nil { // a finished record: Replay or Mismatch, no token
		mres, _ := machine.Claim(&rec, fp, now, 0, nil)
		out = mres.Outcome
	}
	switch out {
	case machine.Replay:
		if kept && fp != nil {
			return driver.ClaimResult{Outcome: driver.Replay, Record: e.record(k, &rec), Now: e.time(now), Shared: true}, true
		}
		return driver.ClaimResult{Outcome: driver.Replay, Record: e.recordCopy(k, &rec), Now: e.time(now)}, true
	case machine.Mismatch:
		return driver.ClaimResult{Outcome: driver.Mismatch, Now: e.time(now)}, true
	}
	return res, false
}
