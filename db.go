package receipts

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/locktable"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/internal/mutate"
	"github.com/receiptstore/receipts/internal/rcache"
)

// tokenBlock is how many fencing tokens are reserved by one synced write of
// the token ceiling. A restart skips what was left of the block.
const tokenBlock = 4096

// waitRecheck bounds how long a waiter sleeps before it re-reads the lease
// clock. Wake-ups from holders in this process are channel-driven; this only
// matters for a holder that died (its lease runs out) and for injected clocks.
const waitRecheck = 250 * time.Millisecond

// DB is a receipts store. It is safe for concurrent use.
type DB struct {
	opts      Options
	pdb       *pebble.DB
	dirLock   *pebble.Lock
	locks     *locktable.Table
	cache     *rcache.Cache // recently finished receipts; nil if disabled
	width     int64         // epoch width, ns
	retention int64         // ns
	ttl       int64         // ns
	secret    []byte
	loc       *time.Location // of Options.Now's times: receipts report times in it
	readOnly  bool           // Options.Pebble.ReadOnly: inspection only

	// hot holds the atomics every call touches, on one cache line of
	// their own: a call moves one line between cores, not several.
	hot      *hotFields
	clockMu  sync.Mutex    // serializes writes of keys.Clock, so the last one written is the largest
	minEpoch atomic.Uint64 // no record lives in an older epoch
	floor    atomic.Uint64 // epochs below were dropped by GC; writes never land there

	tok struct {
		sync.Mutex        // protects next and ceil; held across the ceiling's sync (once per tokenBlock)
		next, ceil uint64 // next token to hand out; first token not yet reserved on disk
	}

	// drained is closed when the last call in flight exits after Close
	// began (hot.gate).
	drained   chan struct{}
	drainOnce sync.Once
	closing   chan struct{} // closed when Close starts: waiters give up
	bgCancel  context.CancelFunc
	bg        sync.WaitGroup // background goroutines (GC loop)

	gcMu   sync.Mutex // one GC at a time
	lastGC atomic.Pointer[GCStats]

	n counters

	est durationEstimate // claim-to-outcome time of attempts, for InProgressError.RetryAfter

	tokenFn func() (uint64, error) // db.newToken, bound once (a method value allocates)
}

type counters struct {
	takeovers, fails, releases, abandons atomic.Uint64
}

// hotFields are the DB's atomics that (nearly) every call touches: 64
// bytes, allocated alone, so on one cache line; a call moves one line
// between cores, not several.
type hotFields struct {
	// gate counts in-flight calls, plus gateClosed once Close has begun.
	gate atomic.Int64
	// clock is the store's time high-water mark (Unix ns): never goes back.
	clock atomic.Int64
	// Counters since Open.
	claims, replays, commits, cacheHits, conflicts, mismatches atomic.Uint64
}

// hotFields must fit one cache line (a size class of its own): adding a
// field past 64 bytes fails to compile here.
const _ = uint8(64 - unsafe.Sizeof(hotFields{}))

// Open opens the store in dir, creating it if needed. Open copies opts; nil
// means defaults. It fails with ErrInvalidOptions for options that cannot
// work, ErrUnknownFormat for a store of a newer format, ErrLocked if another
// process holds dir, and ErrCorrupt if the store's meta data is damaged.
//
// The store records the Retention and LeaseTTL it runs with, so that
// offline tools (receiptctl) see what the service sees. A zero Retention or
// LeaseTTL means the store's recorded value (DefaultRetention and
// DefaultLeaseTTL for a new store, or one written by a version that
// recorded none); a non-zero one that differs is used and recorded (synced)
// in its place, unless the store is opened read-only (Options.Pebble.ReadOnly),
// which uses it without recording it. DB.Options reports the values in force.
// With a zero Retention, a LeaseTTL of DefaultRetention or more is refused:
// set Retention too.
func Open(dir string, opts *Options) (*DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	useStored := storedSettings{retention: o.Retention == 0, leaseTTL: o.LeaseTTL == 0}
	o.ensureDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	po := o.pebbleOptions()
	if o.Pebble == nil || o.Pebble.Experimental.SpanPolicyFunc == nil {
		po.Experimental.SpanPolicyFunc = epochSpans // sstables split at epoch boundaries, for GC
	}
	if err := po.FS.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("receipts: create %s: %w", dir, err)
	}
	lock, err := pebble.LockDirectory(dir, po.FS)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLocked, dir, err)
	}
	po.Lock = lock
	opened := false
	defer func() {
		if !opened { // an error, or a panic out of Pebble (a failed directory fsync)
			_ = lock.Close()
		}
	}()
	pdb, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("receipts: open %s: %w", dir, err)
	}
	db := &DB{
		opts:      o,
		pdb:       pdb,
		dirLock:   lock,
		locks:     locktable.New(),
		cache:     rcache.New(o.ReplayCacheSize),
		retention: int64(o.Retention),
		ttl:       int64(o.LeaseTTL),
		closing:   make(chan struct{}),
		drained:   make(chan struct{}),
		readOnly:  po.ReadOnly,
	}
	db.tokenFn = db.newToken
	db.hot = new(hotFields)
	if err := db.load(useStored); err != nil {
		_ = pdb.Close()
		return nil, err
	}
	db.lastGC.Store(&GCStats{})
	ctx, cancel := context.WithCancel(context.Background())
	db.bgCancel = cancel
	if interval := db.gcInterval(); interval > 0 {
		db.bg.Add(1)
		go db.gcLoop(ctx, interval)
	}
	opened = true
	return db, nil
}

// storedSettings says which options were left zero at Open: those take
// the store's recorded values.
type storedSettings struct{ retention, leaseTTL bool }

// load reads or creates the meta record and restores the token counter, the
// GC floor, the oldest epoch and the clock's high-water mark.
func (db *DB) load(useStored storedSettings) error {
	t := db.opts.Now()
	db.loc = t.Location()
	now := clockNanos(t)
	if err := db.loadMeta(now, useStored); err != nil {
		return err
	}

	ceil, err := db.getCounter(keys.TokenCeiling)
	if err != nil {
		return err
	}
	db.tok.next, db.tok.ceil = max(ceil, 1), max(ceil, 1)
	floor, err := db.getCounter(keys.GCFloor)
	if err != nil {
		return err
	}
	db.floor.Store(floor)

	// The clock never runs behind what the store has seen: the newest epoch
	// holding a record, and the start of the GC floor (GC ran at least the
	// Retention of the time after it). Not floor*width+Retention: reopened
	// with a longer Retention than GC ran with, that is in the future, and
	// the store's time would stand still until then (leases would not run
	// out, abandoned claims could not be taken over).
	hwm := now
	if floor > 0 {
		hwm = max(hwm, int64(floor)*db.width)
	}
	clock, err := db.getCounter(keys.Clock)
	if err != nil {
		return err
	}
	hwm = max(hwm, int64(clock))
	it, err := db.pdb.NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	if err != nil {
		return fmt.Errorf("receipts: open iterator: %w", err)
	}
	defer it.Close()
	minEpoch := uint64(max(hwm, 0) / db.width)
	if it.First() {
		e, ok := keys.Epoch(it.Key())
		if !ok {
			return fmt.Errorf("%w: malformed record key %q", ErrCorrupt, it.Key())
		}
		minEpoch = min(minEpoch, e)
	}
	if it.Last() {
		e, ok := keys.Epoch(it.Key())
		if !ok {
			return fmt.Errorf("%w: malformed record key %q", ErrCorrupt, it.Key())
		}
		hwm = max(hwm, int64(e)*db.width)
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("receipts: scan epochs: %w", err)
	}
	db.minEpoch.Store(max(minEpoch, floor))
	db.hot.clock.Store(hwm)
	return nil
}

// loadMeta reads the meta record, creating it for a new store: the epoch
// width, the ProviderKey secret, and the Retention and LeaseTTL in force
// (the recorded ones for the options left zero). The meta is rewritten,
// synced, when the options in force differ from what it records, or when it
// is of the previous format (which records neither); not on a read-only
// store.
func (db *DB) loadMeta(now int64, useStored storedSettings) error {
	meta, err := db.getMeta()
	write, create := false, false
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		meta = &encoding.Meta{EpochWidth: int64(db.opts.EpochWidth), Secret: make([]byte, 32), CreatedAt: now}
		_, _ = rand.Read(meta.Secret)
		write, create = true, true
	case err != nil:
		return err
	case meta.Format < encoding.MinStoreFormat || meta.Format > encoding.StoreFormat:
		return fmt.Errorf("%w: store format %d, this version reads formats %d to %d", ErrUnknownFormat, meta.Format, encoding.MinStoreFormat, encoding.StoreFormat)
	}
	if meta.Retention > 0 && useStored.retention {
		db.opts.Retention = time.Duration(meta.Retention)
	}
	if meta.LeaseTTL > 0 && useStored.leaseTTL {
		db.opts.LeaseTTL = time.Duration(meta.LeaseTTL)
	}
	if err := db.opts.validate(); err != nil {
		return fmt.Errorf("%w (Retention %s and LeaseTTL %s recorded in the store)", err, time.Duration(meta.Retention), time.Duration(meta.LeaseTTL))
	}
	if err := validateWidth(time.Duration(meta.EpochWidth), db.opts.Retention); err != nil {
		return fmt.Errorf("stored epoch width: %w", err) // nothing written yet
	}
	db.width, db.secret = meta.EpochWidth, meta.Secret
	db.retention, db.ttl = int64(db.opts.Retention), int64(db.opts.LeaseTTL)
	if meta.Format != encoding.StoreFormat || meta.Retention != db.retention || meta.LeaseTTL != db.ttl {
		write = true
	}
	if !write || (db.readOnly && !create) { // a read-only open of no store fails to write
		return nil
	}
	next := *meta
	next.Format, next.Retention, next.LeaseTTL = encoding.StoreFormat, db.retention, db.ttl
	b, err := encoding.EncodeMeta(&next)
	if err != nil {
		return err
	}
	if err := db.pdb.Set(keys.Meta, b, pebble.Sync); err != nil {
		return fmt.Errorf("receipts: write meta: %w", err)
	}
	return nil
}

func (db *DB) getMeta() (*encoding.Meta, error) {
	v, closer, err := db.pdb.Get(keys.Meta)
	if err != nil {
		if errors.Is(err, pebble.ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("receipts: read meta: %w", err)
	}
	defer closer.Close()
	m, err := encoding.DecodeMeta(v)
	if err != nil {
		return nil, fmt.Errorf("%w: meta: %w", ErrCorrupt, err)
	}
	return m, nil
}

func (db *DB) getCounter(key []byte) (uint64, error) {
	v, closer, err := db.pdb.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("receipts: read %q: %w", key, err)
	}
	defer closer.Close()
	n, err := encoding.DecodeUint64(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: %w", ErrCorrupt, key, err)
	}
	return n, nil
}

// Close waits for in-flight calls to finish (their commits land or fail
// cleanly), stops background work and closes the engine. Once it has begun
// no new lease is handed out: callers waiting for another holder's receipt,
// or for the key, get ErrClosed. Afterwards every method returns ErrClosed.
// A second Close returns nil.
func (db *DB) Close() (err error) {
	old := db.hot.gate.Or(gateClosed)
	if old&gateClosed != 0 {
		return nil
	}
	close(db.closing)
	if old != 0 {
		<-db.drained
	}
	db.bgCancel()
	db.bg.Wait()
	defer func() {
		// Runs even if the clock write below panics (a WAL sync failure
		// under a logger whose Fatalf panics): the engine and the directory
		// lock are released either way.
		if cerr := db.pdb.Close(); err == nil {
			err = cerr
		}
		if lerr := db.dirLock.Close(); err == nil {
			err = lerr
		}
		if err != nil {
			err = fmt.Errorf("receipts: close: %w", err)
		}
	}()
	// Persist the clock so that a restart with the clock behind resumes
	// from here (records stay exactly as expired as they were).
	if !db.readOnly {
		err = db.pdb.Set(keys.Clock, encoding.EncodeUint64(uint64(db.hot.clock.Load())), pebble.Sync)
	}
	return err
}

// gateClosed is the bit of hotFields.gate that Close sets.
const gateClosed = 1 << 62

// enter registers an in-flight call; exit ends it. One atomic add each.
func (db *DB) enter() error {
	if db.hot.gate.Add(1)&gateClosed != 0 {
		db.exit()
		return ErrClosed
	}
	return nil
}

// closed reports that Close has begun.
func (db *DB) closed() bool { return db.hot.gate.Load()&gateClosed != 0 }

func (db *DB) exit() {
	if db.hot.gate.Add(-1) == gateClosed { // Close has begun and nothing is in flight
		db.drainOnce.Do(func() { close(db.drained) })
	}
}

// Options returns the options in force: the defaults filled in, the epoch
// width as stored when the store was created. Changing the result changes
// nothing.
func (db *DB) Options() Options {
	o := db.opts
	o.EpochWidth = time.Duration(db.width)
	return o
}

// Pebble returns the engine the store runs on, for the application's own
// data. The store's keys all start with the reserved prefix "\x00rcpt"; keep
// the application's keys out of it. Do not close it: Close does.
func (db *DB) Pebble() *pebble.DB { return db.pdb }

// Checkpoint writes a consistent copy of the store (and of the application's
// data in the same engine) to dir, which must not exist. Open the copy to
// inspect a running service's receipts offline.
func (db *DB) Checkpoint(dir string) error {
	if err := db.enter(); err != nil {
		return err
	}
	defer db.exit()
	if err := db.pdb.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("receipts: checkpoint to %s: %w", dir, err)
	}
	return nil
}

// now returns the store's time: Options.Now, but never earlier than any time
// the store has already used.
func (db *DB) now() int64 {
	t := clockNanos(db.opts.Now())
	for {
		hw := db.hot.clock.Load()
		if t <= hw {
			return hw
		}
		if db.hot.clock.CompareAndSwap(hw, t) {
			return t
		}
	}
}

// epochOf is the epoch a write at t lands in: never below the GC floor.
func (db *DB) epochOf(t int64) uint64 {
	return max(uint64(max(t, 0)/db.width), db.floor.Load())
}

// newToken hands out the next fencing token, reserving a new block on disk
// (synced) when the current one is used up. Tokens are unique store-wide and
// never reused, across restarts and GC.
func (db *DB) newToken() (uint64, error) {
	db.tok.Lock()
	defer db.tok.Unlock()
	if db.tok.next >= db.tok.ceil {
		ceil := db.tok.next + tokenBlock
		if err := db.pdb.Set(keys.TokenCeiling, encoding.EncodeUint64(ceil), pebble.Sync); err != nil {
			return 0, fmt.Errorf("receipts: reserve tokens: %w", err)
		}
		db.tok.ceil = ceil
	}
	t := db.tok.next
	db.tok.next++
	return t, nil
}

// read returns the visible record of k at now and the key it is stored
// under. If the newest record is past retention, rec is nil and stored is its
// key (to delete with the next write). Read errors are returned as errors,
// never as "absent"; undecodable bytes as ErrCorrupt.
//
// REQUIRES: k's lock held, for anything that writes based on the result.
func (db *DB) read(k Key, now int64) (rec *encoding.Record, stored []byte, err error) {
	return db.readCtx(context.Background(), k, now)
}

// readCtx is read bounded by ctx.
func (db *DB) readCtx(ctx context.Context, k Key, now int64) (rec *encoding.Record, stored []byte, err error) {
	rec = new(encoding.Record)
	found, stored, err := db.readInto(ctx, k, now, rec, nil)
	if !found {
		rec = nil
	}
	return rec, stored, err
}

// oldestLiveEpoch is the oldest epoch a lookup at epoch hi probes:
// hi - ceil(Retention/W). That covers every record written within Retention
// (epochOf(now - Retention) is never older), and it guarantees that a copy a
// write did not see, in an older epoch, had expired by the start of epoch hi:
// the store's clock never restarts before the start of the newest epoch on
// disk, so such a copy can never come back to life. When W divides
// Retention (the default, W = Retention/4) the two bounds are the same.
func (db *DB) oldestLiveEpoch(hi uint64) uint64 {
	back := uint64((db.retention + db.width - 1) / db.width)
	lo := db.minEpoch.Load()
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

// readInto is read decoding into rec, building keys in buf (stored aliases
// it). found is false if there is no visible record; stored may still name
// an expired one. It checks ctx every probeCheck epochs.
func (db *DB) readInto(ctx context.Context, k Key, now int64, rec *encoding.Record, buf []byte) (found bool, stored []byte, err error) {
	hi := db.epochOf(now)
	lo := db.oldestLiveEpoch(hi)
	key := keys.AppendRecord(buf[:0], hi, k.Scope, k.ID)
	for e := hi; ; e-- {
		if (hi-e)%probeCheck == probeCheck-1 {
			if err := ctx.Err(); err != nil {
				return false, nil, err
			}
		}
		keys.SetEpoch(key, e)
		v, closer, err := db.pdb.Get(key)
		if err == nil {
			derr := encoding.DecodeRecordInto(rec, v)
			_ = closer.Close()
			if derr != nil {
				return false, nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, k, derr)
			}
			return machine.Visible(rec, now, db.retention), key, nil
		}
		if !errors.Is(err, pebble.ErrNotFound) {
			return false, nil, fmt.Errorf("receipts: read %s: %w", k, err)
		}
		if e <= lo {
			return false, nil, nil
		}
	}
}

// lock takes k's lock in the lock table.
func (db *DB) lock(ctx context.Context, k Key) (*locktable.Entry, error) {
	var buf [keys.MaxLockKeyLen]byte
	return db.locks.Lock(ctx, keys.AppendLockKey(buf[:0], k.Scope, k.ID))
}

// fromCache answers a claim of k with fingerprint fp (nil: a Lookup) at now
// through the replay cache. It probes the epochs exactly as readInto does,
// and answers only if the newest record found is the cached one: intact,
// under the cached epoch, with the cached checksum. The outcome is then
// Replay (with a receipt of the caller's own) or Mismatch. ok is false
// otherwise, for the uncached way to decide. Only synced records are
// cached, so what this answers is durable and needs no key lock. A
// cancelled ctx makes it give up (ok false; the uncached way reports it).
func (db *DB) fromCache(ctx context.Context, k Key, lockKey, fp []byte, now int64) (r *Receipt, out machine.Outcome, ok bool) {
	ent := db.cache.Get(lockKey)
	if ent == nil || (machine.Expired(ent.UpdatedAt, now, db.retention) && mutate.Name != mutate.StaleCache) {
		return nil, 0, false
	}
	hi := db.epochOf(now)
	key := ent.Key
	if hi != ent.Epoch { // the newer epochs must not hold a record
		bp := keyBufs.Get().(*[]byte)
		defer keyBufs.Put(bp)
		key = keys.AppendRecord((*bp)[:0], hi, k.Scope, k.ID)
		*bp = key[:0]
	}
	for e := hi; ; e-- {
		if (hi-e)%probeCheck == probeCheck-1 && ctx.Err() != nil {
			return nil, 0, false
		}
		if e == ent.Epoch {
			key = ent.Key
		} else {
			keys.SetEpoch(key, e)
		}
		v, closer, err := db.pdb.Get(key)
		if err == nil {
			if e == ent.Epoch && ent.Matches(v) {
				rec := ent.View(v)
				out, ok = machine.Replay, true
				if fp != nil { // a finished record: Replay or Mismatch, no token
					res, _ := machine.Claim(&rec, fp, now, db.ttl, nil)
					out, ok = res.Outcome, res.Outcome == machine.Replay || res.Outcome == machine.Mismatch
				}
				if out == machine.Replay {
					r = db.receiptCopy(k, &rec)
				}
			}
			_ = closer.Close()
			if ok {
				db.hot.cacheHits.Add(1)
			}
			return r, out, ok
		}
		if e <= ent.Epoch || e <= db.oldestLiveEpoch(hi) {
			return nil, 0, false
		}
	}
}

// put adds the write of next (last written at now) to b, moving the record
// to the current epoch: the stored key, if any other, is deleted.
// It returns the key written, its epoch and the value.
func (db *DB) put(b *pebble.Batch, k Key, stored []byte, next *encoding.Record, now int64) (key []byte, epoch uint64, enc []byte, err error) {
	epoch = db.epochOf(now)
	key = keys.AppendRecord(make([]byte, 0, keys.RecordLen(k.Scope, k.ID)), epoch, k.Scope, k.ID)
	if stored != nil && string(stored) != string(key) {
		if err := b.Delete(stored, nil); err != nil {
			return nil, 0, nil, err
		}
	}
	enc = encoding.EncodeRecord(next)
	return key, epoch, enc, b.Set(key, enc, nil)
}

// commitWithClock adds the store's clock to b and commits it, synced; the clock
// goes with every deletion, so that no restart, however far behind its
// clock, can bring back an older, expired copy that the deleted record had
// superseded: the store's time never runs backwards across restarts.
func (db *DB) commitWithClock(b *pebble.Batch) error {
	db.clockMu.Lock()
	defer db.clockMu.Unlock()
	if err := b.Set(keys.Clock, encoding.EncodeUint64(uint64(db.hot.clock.Load())), nil); err != nil {
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

func (db *DB) beforeReplay(ctx context.Context, r *Receipt) error {
	if db.opts.BeforeReplay == nil {
		return nil
	}
	return db.opts.BeforeReplay(ctx, r)
}

func (db *DB) receipt(k Key, rec *encoding.Record) *Receipt {
	return newReceipt(k, rec, db.opts.Retention, db.loc)
}

// receiptCopy is receipt for a record whose fingerprint and result alias
// memory the caller must not keep (the engine's bytes): the receipt gets its
// own copy of both.
func (db *DB) receiptCopy(k Key, rec *encoding.Record) *Receipt {
	r := newReceipt(k, rec, db.opts.Retention, db.loc)
	slab := make([]byte, len(rec.Fingerprint)+len(rec.Result))
	nf := copy(slab, rec.Fingerprint)
	copy(slab[nf:], rec.Result)
	r.Fingerprint = slab[:nf:nf]
	if rec.Result != nil {
		r.Result = slab[nf:]
	}
	return r
}

// Lookup returns the visible record of k in any state (a Pending claim
// included), after Options.BeforeReplay. It returns ErrNotFound if there is
// none.
func (db *DB) Lookup(ctx context.Context, k Key) (*Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	if err := k.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var lk [keys.MaxLockKeyLen]byte
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	r, _, ok := db.fromCache(ctx, k, lockKey, nil, db.now())
	if !ok {
		e, err := db.locks.Lock(ctx, lockKey)
		if err != nil {
			return nil, err
		}
		var rec encoding.Record
		bp := keyBufs.Get().(*[]byte)
		found, stored, err := db.readInto(ctx, k, db.now(), &rec, *bp)
		if err == nil && found {
			epoch, _ := keys.Epoch(stored)
			db.cache.Put(lockKey, stored, epoch, &rec) // read under the lock: durable
		}
		keyBufs.Put(bp)
		e.Unlock()
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, k)
		}
		r = db.receipt(k, &rec)
	}
	if err := db.beforeReplay(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}
