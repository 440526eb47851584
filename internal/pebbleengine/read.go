package pebbleengine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/internal/mutate"
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
	_, now, err := e.rmw(ctx, k, lockKey, nil, writeOpts{}, func(cur *encoding.Record, _ int64) (*encoding.Record, bool, error) {
		if cur != nil {
			rec, found = e.record(k, cur), true
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
// buf (stored aliases it), and returns the key it is stored under. found is
// false if there is no visible record; stored may still name an expired one
// (to delete with the next write). Read errors are returned as errors, never
// as "absent"; undecodable bytes as ErrCorrupt. It checks ctx every
// probeCheck epochs.
//
// REQUIRES: k's lock held, for anything that writes based on the result.
func (e *Engine) readInto(ctx context.Context, k driver.Key, now int64, rec *encoding.Record, buf []byte) (found bool, stored []byte, err error) {
	hi := e.epochOf(now)
	lo := e.oldestLiveEpoch(hi)
	key := keys.AppendRecord(buf[:0], hi, k.Scope, k.ID)
	for ep := hi; ; ep-- {
		if (hi-ep)%probeCheck == probeCheck-1 {
			if err := ctx.Err(); err != nil {
				return false, nil, err
			}
		}
		keys.SetEpoch(key, ep)
		v, closer, err := e.pdb.Get(key)
		if err == nil {
			derr := encoding.DecodeRecordInto(rec, v)
			_ = closer.Close()
			if derr != nil {
				return false, nil, fmt.Errorf("%w: %s: %w", driver.ErrCorrupt, k, derr)
			}
			return machine.Visible(rec, now, e.retention), key, nil
		}
		if !errors.Is(err, pebble.ErrNotFound) {
			return false, nil, fmt.Errorf("receipts: read the record: %w", err)
		}
		if ep <= lo {
			return false, nil, nil
		}
	}
}

// fromCache answers a claim of k with fingerprint fp (nil: a Lookup) at now
// through the replay cache. It probes the epochs exactly as readInto does,
// and answers only if the newest record found is the cached one: intact,
// under the cached epoch, with the cached checksum. The outcome is then
// Replay (with a record of the caller's own) or Mismatch. ok is false
// otherwise, for the uncached way to decide. Only synced records are
// cached, so what this answers is durable and needs no key lock. A
// cancelled ctx makes it give up (ok false; the uncached way reports it).
func (e *Engine) fromCache(ctx context.Context, k driver.Key, lockKey, fp []byte, now int64) (res driver.ClaimResult, ok bool) {
	ent := e.cache.Get(lockKey)
	if ent == nil || (machine.Expired(ent.UpdatedAt, now, e.retention) && mutate.Name != mutate.StaleCache) {
		return res, false
	}
	hi := e.epochOf(now)
	key := ent.Key
	if hi != ent.Epoch { // the newer epochs must not hold a record
		bp := keyBufs.Get().(*[]byte)
		defer keyBufs.Put(bp)
		key = keys.AppendRecord((*bp)[:0], hi, k.Scope, k.ID)
		*bp = key[:0]
	}
	for ep := hi; ; ep-- {
		if (hi-ep)%probeCheck == probeCheck-1 && ctx.Err() != nil {
			return res, false
		}
		if ep == ent.Epoch {
			key = ent.Key
		} else {
			keys.SetEpoch(key, ep)
		}
		v, closer, err := e.pdb.Get(key)
		if err == nil {
			if ep == ent.Epoch && ent.Matches(v) {
				rec := ent.View(v)
				out := machine.Replay
				if fp != nil { // a finished record: Replay or Mismatch, no token
					mres, _ := machine.Claim(&rec, fp, now, 0, nil)
					out = mres.Outcome
				}
				switch out {
				case machine.Replay:
					res, ok = driver.ClaimResult{Outcome: driver.Replay, Record: e.recordCopy(k, &rec), Now: e.time(now)}, true
				case machine.Mismatch:
					res, ok = driver.ClaimResult{Outcome: driver.Mismatch, Now: e.time(now)}, true
				}
			}
			_ = closer.Close()
			if ok {
				e.hot.CacheHits.Add(1)
			}
			return res, ok
		}
		if ep <= ent.Epoch || ep <= e.oldestLiveEpoch(hi) {
			return res, false
		}
	}
}
