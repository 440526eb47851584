package pebbleengine

import (
	"context"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/mutate"
)

// writeOpts says how rmw commits what it writes.
type writeOpts struct {
	noSync bool // not synced: renewals, and DoBatch's claim
	notify bool // wake the key's waiters once the write is in
	claim  bool // a claim: refused (driver.ErrClosed) once Config.Closing reports true
	// tomb, if not nil: when k has no visible record, rmw looks for its
	// tombstone; if one is in force it is reported here and decide is not
	// called (nothing is written).
	tomb *tombOut
	// erased, if not nil (a claim): when k's scope is erased (privacy.go), the end of
	// the erasure is reported here and nothing is written. A write without it returns
	// driver.ErrLeaseLost then.
	erased *erasedSpan
	// read: a read under the key lock (Lookup, Tombstone), which decide never makes
	// write; it is not refused in an erased scope (it finds what is there), but what it
	// reads there is not cached.
	read bool
}

var (
	notified = writeOpts{notify: true} // finishes, releases, abandons
	unsynced = writeOpts{noSync: true} // renewals
)

// decideFunc decides a write from the visible record cur (nil if none) at
// the store's time now: next is the record to write, del deletes the
// record; neither writes nothing.
type decideFunc func(cur *encoding.Record, now int64) (next *encoding.Record, del bool, err error)

// rmw is the one read-modify-write path of a key:
//
//  1. take k's lock (lockKey, keys.AppendLockKey of k);
//  2. take the store's time; a claim gives up here (after the time, under
//     the lock) once the DB's Close has begun;
//     read the visible record at that time (from the memo of k's last
//     Pending record written, readMemo, or else readInto: the newest
//     live epoch holding k, from the current one back);
//  3. let decide choose what to write;
//  4. drop k's replay-cache and memo entries (before anything of k
//     changes), then write decide's choice into b (the caller's, holding
//     an effect, or a new batch), moving the record to the current epoch
//     (put), and commit, synced unless wo.noSync (a deletion also writes
//     the clock: commitWithClock);
//  5. remember a finished, synced record in the replay cache: the one
//     written, or, if nothing is, the one read (it was read under the
//     lock, so it is durable); remember a Pending record written in the
//     memo;
//  6. wake the key's waiters if wo.notify, then unlock.
//
// The lock is held across the sync, so no same-key caller sees a write
// before it is durable. It returns the record written and the store's time.
//
// sc, if not nil, is rmw's memory, from scratch(): the caller's, who
// releases it once done with the record rmw returns, so that decide may
// build that record in sc.next (machine's Into functions) instead of
// allocating one. (A parameter, not a field of wo: escape analysis does not
// tell a struct's fields apart, and wo's tomb and erased would go to the
// heap with it.)
func (e *Engine) rmw(ctx context.Context, k driver.Key, lockKey []byte, b *pebble.Batch, wo writeOpts, sc *rmwScratch, decide decideFunc) (*encoding.Record, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	ent, err := e.locks.Lock(ctx, lockKey)
	if err != nil {
		return nil, 0, err
	}
	// One deferred call for the three clean-ups, in the order three defers
	// would run them (the batch, the scratch, the lock): Go open-codes it,
	// where three defers in a function with this many returns are pushed
	// and popped at run time, twice per Do.
	var ownSc *rmwScratch  // rmw's own scratch, released when it returns
	var ownB *pebble.Batch // rmw's own batch, closed when it returns
	defer func() {
		if ownB != nil {
			_ = ownB.Close()
		}
		if ownSc != nil {
			ownSc.release()
		}
		ent.Unlock()
	}()
	now := e.now()
	if wo.claim && e.closing() {
		// Checked under the key lock, after the claim's time was taken: a
		// claim admitted before Close began but waiting for the lock past
		// that writes nothing, and no claim whose time is later than the
		// start of Close is handed out (nor would its Commit succeed and
		// leave a synced claim).
		return nil, 0, driver.ErrClosed
	}
	sp, erased := e.erasedAt(k.Scope, now)
	if erased && !wo.read {
		// Checked under the key lock: EraseScope publishes the erasure, then waits
		// for every holder of a key lock of the scope, so no write of the scope
		// that did not see it lands after its deletions.
		if wo.erased == nil {
			return nil, 0, fmt.Errorf("%w: the key's scope is erased", driver.ErrLeaseLost)
		}
		*wo.erased = sp
		return nil, now, nil
	}
	if sc == nil {
		sc = rmwBufs.Get().(*rmwScratch)
		ownSc = sc
	}
	rec, bp := &sc.rec, &sc.read
	found, stored, raw, err := true, []byte(nil), []byte(nil), error(nil)
	var memoed bool
	if stored, memoed = e.readMemo(lockKey, now, rec, *bp); !memoed {
		found, stored, raw, err = e.readInto(ctx, k, now, rec, *bp)
	}
	if stored != nil { // readInto may have grown the buffer
		*bp = stored[:0]
	}
	if err != nil {
		return nil, 0, err
	}
	cur := rec
	if !found {
		cur = nil
		if wo.tomb != nil {
			buf := *bp
			if stored != nil {
				buf = nil // tombstone reads no marker then
			}
			if wo.tomb.usedAt, wo.tomb.ok, err = e.tombstone(ctx, k, now, rec, stored, buf); err != nil {
				return nil, 0, err
			}
			if wo.tomb.ok {
				return nil, now, nil
			}
		}
	}
	next, del, err := decide(cur, now)
	if err != nil {
		return nil, 0, err
	}
	if next == nil && !del {
		if cur != nil && !erased { // cached from the bytes read (raw; nil from the memo: pending, not cached)
			epoch, _ := keys.Epoch(stored)
			e.cache.PutEncoded(lockKey, stored, epoch, cur, raw)
		}
		return nil, now, nil
	}
	// The key's cache entry goes before its record changes, under the
	// lock: no reader finds it from here on, and only a write of the key
	// (under this lock) puts another. What was read from it before this
	// point was the record in force then.
	if mutate.Name != mutate.CacheKeep {
		e.cache.Delete(lockKey)
	}
	if mutate.Name != mutate.MemoKeep {
		e.memo.delete(lockKey) // the same for the memo of the last write
	}
	if b == nil {
		b = e.pdb.NewBatch()
		ownB = b
	}
	var key, enc []byte
	var epoch uint64
	if del {
		if err = b.Delete(stored, nil); err == nil {
			if err = e.deleteMarker(b, stored); err == nil {
				err = e.commitWithClock(b)
			}
		}
	} else if key, epoch, enc, err = e.put(b, k, stored, next, now, sc); err == nil {
		err = commitBatch(b, wo.noSync)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("receipts: write the record: %w", err)
	}
	if next != nil && !wo.noSync {
		e.cache.PutEncoded(lockKey, key, epoch, next, enc) // synced (finished records only)
	}
	if next != nil && next.State == encoding.StatePending {
		e.memo.put(lockKey, key, epoch, enc) // durable or not: it is what Pebble holds
	}
	if wo.notify {
		ent.Notify()
	}
	return next, now, nil
}

// closing reports that the DB's Close has begun.
func (e *Engine) closing() bool { return e.cfg.Closing != nil && e.cfg.Closing() }

// rmwScratch is one rmw's memory, reused (rmwBufs): the record read and
// the buffers of the keys read and of the key and bytes written. Pebble's
// batch, the replay cache and the memo copy what they keep, and decide
// functions copy what they keep of the record they are shown, so nothing
// refers to it once rmw has returned (or, given to rmw by its caller, once
// the caller releases it: the record written may then be next).
type rmwScratch struct {
	rec      encoding.Record
	next     encoding.Record // room for the record to write (rmw's sc)
	read     []byte          // readInto's keys (stored, raw)
	key, enc []byte          // put's: the key and the bytes written
}

// scratch returns an rmwScratch for rmw's sc; release it once done
// with the record rmw returned.
func scratch() *rmwScratch { return rmwBufs.Get().(*rmwScratch) }

var rmwBufs = sync.Pool{New: func() any { return &rmwScratch{read: make([]byte, 0, 128)} }}

// maxPooledBuf is the largest buffer rmwBufs keeps: a large result's goes
// with its rmw.
const maxPooledBuf = 4 << 10

func (sc *rmwScratch) release() {
	sc.rec, sc.next = encoding.Record{}, encoding.Record{} // nothing kept alive by the pool
	if cap(sc.read) > maxPooledBuf {
		sc.read = make([]byte, 0, 128)
	}
	if cap(sc.enc) > maxPooledBuf {
		sc.enc = nil
	}
	rmwBufs.Put(sc)
}

// put adds the write of next (last written at now) to b, moving the record
// to the current epoch: the stored key, if any other, is deleted, with the
// tombstone marker a store of format 3 keeps beside it (deleteMarker; none
// is written with a record). It returns the key written, its epoch and the
// value, in sc's buffers (valid until sc is released).
func (e *Engine) put(b *pebble.Batch, k driver.Key, stored []byte, next *encoding.Record, now int64, sc *rmwScratch) (key []byte, epoch uint64, enc []byte, err error) {
	epoch = e.epochOf(now)
	key = keys.AppendRecord(sc.key[:0], epoch, k.Scope, k.ID)
	sc.key = key
	if stored != nil && string(stored) != string(key) {
		if err := b.Delete(stored, nil); err != nil {
			return nil, 0, nil, err
		}
		if err := e.deleteMarker(b, stored); err != nil {
			return nil, 0, nil, err
		}
	}
	enc = encoding.AppendRecord(sc.enc[:0], next)
	sc.enc = enc
	if err := b.Set(key, enc, nil); err != nil { // Set copies both
		return nil, 0, nil, err
	}
	return key, epoch, enc, nil
}

// commitWithClock adds the store's clock to b and commits it, synced; the
// clock goes with every deletion, so that no restart, however far behind
// its clock, can bring back an older, expired copy that the deleted record
// had superseded: the store's time never runs backwards across restarts.
func (e *Engine) commitWithClock(b *pebble.Batch) error {
	e.clockMu.Lock()
	defer e.clockMu.Unlock()
	if err := b.Set(keys.Clock, encoding.EncodeUint64(uint64(e.hot.Clock.Load())), nil); err != nil {
		return err
	}
	return commitBatch(b, false)
}

// commitBatch writes b, synced unless noSync.
func commitBatch(b *pebble.Batch, noSync bool) error {
	wo := pebble.Sync
	if noSync || mutate.Name == mutate.NoSync {
		wo = pebble.NoSync
	}
	return b.Commit(wo)
}
