// Package pebblestore is the Pebble engine of receipts: the embedded store in
// one directory on disk, as package pgstore is the PostgreSQL engine. Open
// returns the same *receipts.DB as receipts.Open, with Pebble's own options
// (an in-memory or fault-injecting FS for tests, the block cache, the replay
// cache), and this package holds what names a Pebble type:
//
//   - DB: the *pebble.DB the store runs on, for the application's own data;
//   - Checkpoint: a consistent copy of the store and that data;
//   - DoBatch, RunBatch and CommitWith: the application's writes in a
//     *pebble.Batch that commits with the Succeeded receipt in one synced
//     write;
//   - Effect: the same, as a receipts.Effect for Lease.Stage and the front
//     ends' Attempt.Stage.
//
// Everything here goes through the root's contract (receipts.OpenEngine,
// Lease.Run, Lease.Commit); the batch reaches the engine in the call's
// context, so the root itself names no Pebble type.
package pebblestore

import (
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/pebbleengine"
)

// Defaults of the Pebble engine's own options.
const (
	// DefaultCacheSize is Pebble's block cache when Options.Pebble sets
	// neither Cache nor CacheSize.
	DefaultCacheSize = pebbleengine.DefaultCacheSize
	// DefaultLBaseMaxBytes is Pebble's LBaseMaxBytes (the size of the level
	// L0 is compacted into) when Options.Pebble leaves it zero: 8 MiB
	// rather than Pebble's 64 MiB, because operation keys are spread over
	// the key space and each such compaction rewrites most of that level.
	DefaultLBaseMaxBytes = pebbleengine.DefaultLBaseMaxBytes
	// DefaultReplayCacheSize is the memory kept for recently finished
	// receipts when Options.ReplayCacheSize is zero.
	DefaultReplayCacheSize = pebbleengine.DefaultReplayCacheSize
)

// ErrLocked is returned by Open when another process (or another DB in this
// process) holds the directory: receipts.ErrLocked.
var ErrLocked = receipts.ErrLocked

// Options configure a store on Pebble. A nil *Options means all defaults.
type Options struct {
	// Options are the settings every engine shares, with the same meaning
	// as for receipts.Open.
	receipts.Options
	// CompactOnGC makes GC ask Pebble to compact the dropped range at once,
	// returning the disk space immediately rather than when Pebble's
	// delete-only compactions get to it.
	CompactOnGC bool
	// Pebble tunes the engine (cache, FS, ...). It is cloned, never changed.
	// Its FS lets tests use vfs.NewMem, vfs.NewCrashableMem or errorfs.
	// Levels without a filter policy get 10-bit Bloom filters, the block
	// cache is DefaultCacheSize unless Cache or CacheSize is set, and
	// LBaseMaxBytes is DefaultLBaseMaxBytes unless set.
	Pebble *pebble.Options
	// ReplayCacheSize is the memory, in bytes, for remembering recently
	// finished receipts, so that a retry of one is answered without the key
	// lock or decoding: from memory for a small receipt (its stored bytes,
	// if at most ReplayCacheSize/64 and 1 MiB, are kept), with a single
	// engine read checked against the remembered record's checksum
	// otherwise. Only receipts whose commit has been synced are remembered,
	// and the answer is always the one an uncached read gives: a finished
	// receipt never changes while it is visible, every write of a key drops
	// its entry first, and expiry is judged at the read. Once DB has
	// handed out the engine (whose user could write the store's keys behind
	// its back) replays are always checked against the engine. Zero means
	// DefaultReplayCacheSize (about 15,000 receipts with 128-byte results
	// and 44-byte keys); negative disables it. The size bounds the memory
	// the cache holds, entries and table together: an entry takes about
	// 170 bytes (its fixed fields and its share of the table), plus its key
	// twice, its trace context and the receipt's stored bytes if they are
	// kept. Entries are written into chunks of
	// about 1/16 of the size (at most 64 MiB each); when the chunks are
	// full, the oldest chunk's entries (the least recently written) are
	// dropped together.
	ReplayCacheSize int64
}

// Open opens the store in dir on the Pebble engine, creating it if needed:
// receipts.Open with the Pebble engine's own options. It fails as
// receipts.Open does (ErrInvalidOptions, ErrUnknownFormat, ErrLocked,
// ErrCorrupt). With Pebble.ReadOnly the store is opened for inspection: a
// Retention or LeaseTTL given is used without being recorded.
func Open(dir string, opts *Options) (*receipts.DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	rc := o.ReplayCacheSize
	if rc == 0 {
		rc = DefaultReplayCacheSize
	}
	return receipts.OpenEngine(pebbleengine.Opener(dir, pebbleengine.Config{
		Pebble:          o.Pebble,
		CompactOnGC:     o.CompactOnGC,
		ReplayCacheSize: rc,
	}), &o.Options)
}

// engine returns db's Pebble engine, or an error wrapping
// receipts.ErrUnsupported naming what was asked.
func engine(db *receipts.DB, what string) (*pebbleengine.Engine, error) {
	return pebbleOf(db.Driver(), what)
}

// leaseEngine is engine for l's store (read through Lease.Raw, the engine
// packages' door: after Close, receipts.ErrClosed).
func leaseEngine(ctx context.Context, l *receipts.Lease, what string) (*pebbleengine.Engine, error) {
	var e *pebbleengine.Engine
	_, err := l.Raw(ctx, func(_ context.Context, eng driver.Engine, _ driver.LeaseInfo) (*driver.Record, error) {
		var err error
		e, err = pebbleOf(eng, what)
		return nil, err
	})
	return e, err
}

func pebbleOf(eng driver.Engine, what string) (*pebbleengine.Engine, error) {
	if e, ok := eng.(*pebbleengine.Engine); ok {
		return e, nil
	}
	return nil, fmt.Errorf("%w: pebblestore.%s on the %s engine", receipts.ErrUnsupported, what, eng.Name())
}

// DB returns the Pebble database the store runs on, for the application's
// own data. The store's keys all start with the reserved prefix "\x00rcpt";
// keep the application's keys out of it. Do not close it: the store's Close
// does. On another engine it returns nil. Once it has been called, replays
// are checked against the engine rather than answered from the replay
// cache's memory (Options.ReplayCacheSize): the store cannot see what is
// written with it.
func DB(db *receipts.DB) *pebble.DB {
	if e := pebbleengine.Of(db); e != nil {
		return e.DB()
	}
	return nil
}

// Checkpoint writes a consistent copy of the store (and of the
// application's data in the same engine) to dir, which must not exist. Open
// the copy to inspect a running service's receipts offline. On another
// engine it returns an error wrapping receipts.ErrUnsupported; after Close,
// receipts.ErrClosed.
func Checkpoint(db *receipts.DB, dir string) error {
	e, err := engine(db, "Checkpoint")
	if err != nil {
		return err
	}
	return e.Checkpoint(dir)
}

// DoBatch is receipts.DB.Do for effects that live in this same engine: fn
// writes its effect into b (the application's own keys), and the effect
// commits with the receipt in one synced batch. A crash loses an unsynced
// claim together with the effect it guarded, so the claim is not synced:
// one fsync per operation. If fn returns an error, b is discarded (a Failed
// receipt is written without it). opts are as for Do. On another engine
// than Pebble it returns an error wrapping receipts.ErrUnsupported.
func DoBatch(ctx context.Context, db *receipts.DB, k receipts.Key, fingerprint []byte,
	fn func(ctx context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error), opts ...receipts.ClaimOption,
) (*receipts.Receipt, error) {
	e, err := engine(db, "DoBatch")
	if err != nil {
		return nil, err
	}
	b := e.NewBatch()
	defer b.Close()
	u := &pebbleengine.Unit{Batch: b}
	return db.Do(pebbleengine.WithUnit(ctx, u), k, fingerprint, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		u.Bind(l.Token())
		return fn(ctx, l, b)
	}, opts...)
}

// RunBatch is receipts.Lease.Run for effects that live in this same engine:
// fn writes its effect into b (the application's own keys), and a Succeeded
// receipt commits with b in one synced batch. For any other outcome b is
// discarded. On another engine than Pebble it returns an error wrapping
// receipts.ErrUnsupported.
func RunBatch(ctx context.Context, l *receipts.Lease,
	fn func(ctx context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error),
) (*receipts.Receipt, error) {
	e, err := leaseEngine(ctx, l, "RunBatch")
	if err != nil {
		return nil, err
	}
	b := e.NewBatch()
	defer b.Close()
	u := &pebbleengine.Unit{Batch: b}
	u.Bind(l.Token())
	return l.Run(pebbleengine.WithUnit(ctx, u), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return fn(ctx, l, b)
	})
}

// CommitWith commits l's receipt together with an effect in this engine:
// effect writes into b (the application's own keys, in DB), and b commits
// with the receipt in one synced batch. If the lease is lost, effect is not
// called and nothing is written (receipts.ErrLeaseLost); if effect returns
// an error, nothing is written, the lease is still held, and that error is
// returned (wrapped). Effects staged with Lease.Stage are written first. On
// another engine than Pebble it returns an error wrapping
// receipts.ErrUnsupported: Stage an Effect, then Commit, on every engine.
func CommitWith(ctx context.Context, l *receipts.Lease, result []byte, effect func(b *pebble.Batch) error) (*receipts.Receipt, error) {
	if _, err := leaseEngine(ctx, l, "CommitWith"); err != nil {
		return nil, err
	}
	if effect == nil {
		return l.Commit(ctx, result)
	}
	u := &pebbleengine.Unit{Effect: effect}
	u.Bind(l.Token())
	return l.Commit(pebbleengine.WithUnit(ctx, u), result)
}

// Effect returns a receipts.Effect that writes into the Pebble batch which
// carries the Succeeded receipt: stage it on a lease (Lease.Stage), or on a
// front end's attempt (receipthttp's and receiptmcp's Attempt.Stage), and
// it commits with the receipt in one synced batch, or not at all. On
// another engine it writes nothing and the commit fails with
// receipts.ErrUnsupported.
func Effect(f func(b *pebble.Batch) error) receipts.Effect {
	return receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error { return f(b) })
}
