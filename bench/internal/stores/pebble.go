package stores

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/pebblestore"
)

// CacheSize is the Pebble block cache both the floor and the engine get in benchmarks.
// Pebble's default (8 MiB) is not used: Pebble reserves its memtables' memory in the
// block cache, and two 4 MiB memtables (the mutable one and the one being flushed or
// kept for reuse) take all 8 MiB, leaving no room for blocks: every read that misses the
// memtables goes to the filesystem.
const CacheSize = 64 << 20

// PebbleOptions returns the Pebble options both the floor and the engine run with in
// benchmarks: Pebble's defaults, on disk, with a CacheSize block cache, bloom filters on
// every level (what makes a probe of an absent key cheap) and the engine's default
// LBaseMaxBytes (pebblestore.DefaultLBaseMaxBytes, 8 MiB against Pebble's 64 MiB), so that
// the floor is raw Pebble tuned as the engine is. Each call returns a fresh
// value.
func PebbleOptions() *pebble.Options {
	o := &pebble.Options{CacheSize: CacheSize, LBaseMaxBytes: pebblestore.DefaultLBaseMaxBytes}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	o.Logger = quietLogger{}
	return o
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	pebble.DefaultLogger.Fatalf(format, args...)
}

// Floor is raw Pebble doing the least any correct store must do for a first call: a Get
// to see that the key is absent, a synced Set of the claim (it must be durable before an
// external effect starts) and a synced Set of the commit, all under a per-key stripe lock.
// A replay is one Get.
type Floor struct {
	DB     *pebble.DB
	locks  *stripes
	tokens atomic.Uint64
	// Effect, when set, adds a small application write to the commit batch (the floor of
	// CommitWith).
	Effect bool
	// NoSyncClaim leaves the claim unsynced (the floor of DoBatch).
	NoSyncClaim bool
	// epoch is the time partition new records go to, as in the engine's layout.
	epoch atomic.Uint32
}

// SetEpoch makes later writes go to epoch e.
func (f *Floor) SetEpoch(e uint32) { f.epoch.Store(e) }

// DropEpoch deletes every record of epoch e with one synced range deletion: the floor of
// the engine's GC.
func (f *Floor) DropEpoch(e uint32) error {
	start := binary.BigEndian.AppendUint32([]byte{'r'}, e)
	end := binary.BigEndian.AppendUint32([]byte{'r'}, e+1)
	return f.DB.DeleteRange(start, end, pebble.Sync)
}

// OpenFloor opens (creating) a Pebble store in dir.
func OpenFloor(dir string, opts *pebble.Options) (*Floor, error) {
	if opts == nil {
		opts = PebbleOptions()
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, err
	}
	return &Floor{DB: db, locks: newStripes()}, nil
}

func (f *Floor) Name() string { return "pebble-floor" }

func (f *Floor) Close() error { return f.DB.Close() }

// Settle flushes the memtables and compacts everything.
func (f *Floor) Settle() error { return SettlePebble(f.DB) }

func (f *Floor) Do(_ context.Context, k workload.Key, fp, result []byte) (bool, error) {
	key := recordKey(k, f.epoch.Load())
	mu := f.locks.lock(k)
	defer mu.Unlock()
	v, c, err := f.DB.Get(key)
	switch {
	case err == nil:
		err = checkRecord(v, fp)
		c.Close()
		return err == nil, err
	case !errors.Is(err, pebble.ErrNotFound):
		return false, err
	}
	now := time.Now()
	tok := f.tokens.Add(1)
	claimOpts := pebble.Sync
	if f.NoSyncClaim {
		claimOpts = pebble.NoSync
	}
	if err := f.DB.Set(key, encodeRecord(statePending, fp, nil, tok, now), claimOpts); err != nil {
		return false, err
	}
	commit := encodeRecord(stateSucceeded, fp, result, tok, now)
	if !f.Effect {
		return false, f.DB.Set(key, commit, pebble.Sync)
	}
	b := f.DB.NewBatch()
	defer b.Close()
	ek, ev := workload.Effect(k)
	_ = b.Set(ek, ev, nil)
	_ = b.Set(key, commit, nil)
	return false, b.Commit(pebble.Sync)
}

func (f *Floor) Replay(_ context.Context, k workload.Key, fp []byte) error {
	v, c, err := f.DB.Get(recordKey(k, f.epoch.Load()))
	if err != nil {
		if errors.Is(err, pebble.ErrNotFound) {
			return ErrNotCommitted
		}
		return err
	}
	err = checkRecord(v, fp)
	c.Close()
	return err
}
