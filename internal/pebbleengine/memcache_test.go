package pebbleengine

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/rcache"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// Replays answered from the replay cache's bytes (rcache.Entry.Val), on the
// real engine.

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func openMem(t *testing.T, clk *fakeClock, cacheSize int64) *Engine {
	t.Helper()
	e, err := Open("db", Config{
		Config: driver.Config{
			Retention: time.Hour, LeaseTTL: 30 * time.Second, EpochWidth: 15 * time.Minute,
			Now: clk.Now, Logger: slog.Default(), TombstoneWindow: -1, // an expired key can be claimed again
		},
		Pebble:          &pebble.Options{FS: vfs.NewMem()},
		ReplayCacheSize: cacheSize,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// finishKey claims k with fp and finishes it with result.
func finishKey(t *testing.T, e *Engine, k driver.Key, fp, result string) {
	t.Helper()
	ctx := context.Background()
	res, err := e.Claim(ctx, driver.ClaimRequest{Key: k, Fingerprint: []byte(fp), LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	require.Contains(t, []driver.Outcome{driver.Claimed, driver.TookOver}, res.Outcome)
	_, err = e.Finish(ctx, k, res.Record.Token, driver.Succeeded, []byte(result))
	require.NoError(t, err)
}

func replay(t *testing.T, e *Engine, k driver.Key, fp string) driver.ClaimResult {
	t.Helper()
	res, err := e.Claim(context.Background(), driver.ClaimRequest{Key: k, Fingerprint: []byte(fp), LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	return res
}

// TestReplayFromMemory: a small finished receipt is replayed without
// reading Pebble (its record deleted behind the engine's back, with the
// engine's own handle, is still replayed), and stops being so once the raw
// handle is handed out (DB): the replay then reads Pebble and finds the
// record gone. Fails under the cacheraw mutation.
func TestReplayFromMemory(t *testing.T) {
	e, k, _, ent := openFinished(t, "A", "a")
	require.NotNil(t, ent.Val, "a small receipt's bytes are held")

	require.NoError(t, e.pdb.Delete(ent.Key, pebble.Sync)) // not through DB(): the flag stays off
	hits := e.cacheHits.Load()
	res := replay(t, e, k, "A")
	require.Equal(t, driver.Replay, res.Outcome, "answered from memory, Pebble not read")
	require.Equal(t, "a", string(res.Record.Result))
	require.Equal(t, driver.Mismatch, replay(t, e, k, "B").Outcome)
	require.Equal(t, hits+2, e.cacheHits.Load())

	_ = e.DB() // the caller may now write behind the engine's back
	res = replay(t, e, k, "A")
	require.Equal(t, driver.Claimed, res.Outcome, "after DB(), a replay reads Pebble (the record is gone)")
}

// TestReplayFromMemoryLargeRecordReadsPebble: a record above budget/64 keeps
// no bytes, and its replay is checked against Pebble.
func TestReplayFromMemoryLargeRecordReadsPebble(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, 64<<10) // budget/64 = 1 KiB
	k := driver.Key{Scope: "s", ID: "big"}
	finishKey(t, e, k, "A", string(make([]byte, 2048)))
	var lk [keys.MaxLockKeyLen]byte
	ent := cached(e, keys.AppendLockKey(lk[:0], k.Scope, k.ID))
	require.NotNil(t, ent)
	require.Nil(t, ent.Val, "a large receipt's bytes are not held")
	require.Equal(t, driver.Replay, replay(t, e, k, "A").Outcome)
	require.NoError(t, e.pdb.Delete(ent.Key, pebble.Sync))
	require.Equal(t, driver.Claimed, replay(t, e, k, "A").Outcome, "checked against Pebble: the record is gone")
}

// TestWriteDeletesCacheEntry: every write of a key drops its cache entry
// first, under the key lock. K is finished with fingerprint A, expires,
// and is claimed again with B: the claim's write (a pending record, which
// is not cached) must leave no entry of A behind; once B finishes, replays
// give B's result. A finished record cannot change while visible, so the
// stale entry would be expired: the entry itself is what shows the
// invariant. Fails under the cachekeep mutation.
func TestWriteDeletesCacheEntry(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, 1<<20)
	ctx := context.Background()
	k := driver.Key{Scope: "s", ID: "k"}
	var lk [keys.MaxLockKeyLen]byte
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	finishKey(t, e, k, "A", "a")
	require.Equal(t, "a", string(replay(t, e, k, "A").Record.Result))
	require.NotNil(t, cached(e, lockKey))

	clk.Add(time.Hour + time.Second) // A expires
	res, err := e.Claim(ctx, driver.ClaimRequest{Key: k, Fingerprint: []byte("B"), LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	require.Equal(t, driver.Claimed, res.Outcome)
	require.Nil(t, cached(e, lockKey), "the claim's write left the key's cache entry in place")
	_, err = e.Finish(ctx, k, res.Record.Token, driver.Succeeded, []byte("b"))
	require.NoError(t, err)
	got := replay(t, e, k, "B")
	require.Equal(t, driver.Replay, got.Outcome)
	require.Equal(t, "b", string(got.Record.Result))
	require.Equal(t, driver.Mismatch, replay(t, e, k, "A").Outcome)

	// A first attempt's release deletes the record: no entry survives it.
	k2 := driver.Key{Scope: "s", ID: "k2"}
	lockKey2 := keys.AppendLockKey(nil, k2.Scope, k2.ID)
	finishKey(t, e, k2, "A", "a")
	clk.Add(time.Hour + time.Second)
	res, err = e.Claim(ctx, driver.ClaimRequest{Key: k2, Fingerprint: []byte("B"), LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	require.NoError(t, e.Release(ctx, k2, res.Record.Token, false))
	require.Nil(t, cached(e, lockKey2))
	_, found, _, err := e.Lookup(ctx, k2)
	require.NoError(t, err)
	require.False(t, found)
}

// TestReplayFromMemoryExpiresExactly: the memory answer uses the engine's
// visibility test at read time: visible one nanosecond before Retention
// ends, gone at Retention.
func TestReplayFromMemoryExpiresExactly(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, 1<<20)
	k := driver.Key{Scope: "s", ID: "k"}
	finishKey(t, e, k, "A", "a")
	clk.Add(time.Hour - time.Nanosecond)
	require.Equal(t, driver.Replay, replay(t, e, k, "A").Outcome)
	clk.Add(time.Nanosecond)
	require.Equal(t, driver.Claimed, replay(t, e, k, "A").Outcome)
}

// cached is e's replay cache entry for lockKey, or nil.
func cached(e *Engine, lockKey []byte) *rcache.Entry {
	ent, ok := e.cache.Get(lockKey)
	if !ok {
		return nil
	}
	return &ent
}

// TestUncachedReadCachesStoredBytes: a record read from Pebble (its cache
// entry gone) is cached from the bytes read, not from an encoding of the
// decoded record: the entry's held bytes, length and checksum are the
// stored ones even when the stored encoding is not the one the engine
// writes today (here, times as msgpack int64 rather than compact ints),
// so the next replay is answered from memory and the one after a
// DB handover still matches what Pebble holds.
func TestUncachedReadCachesStoredBytes(t *testing.T) {
	e, k, lockKey, ent := openFinished(t, "fp", "result")
	v, closer, err := e.pdb.Get(ent.Key)
	require.NoError(t, err)
	rec, err := encoding.DecodeRecord(v)
	require.NoError(t, err)
	_ = closer.Close()

	// The same record, its ints not compact: decodes to the same record.
	var body bytes.Buffer
	enc := msgpack.NewEncoder(&body)
	require.NoError(t, enc.EncodeArrayLen(7))
	require.NoError(t, enc.EncodeBytes(rec.Fingerprint))
	require.NoError(t, enc.EncodeBytes(rec.Result))
	for _, n := range []int64{int64(rec.Attempts), int64(rec.Token), rec.CreatedAt, rec.UpdatedAt, rec.LeaseExpiresAt} {
		require.NoError(t, enc.EncodeInt64(n))
	}
	odd := append([]byte{encoding.RecordVersion, byte(rec.State)}, body.Bytes()...)
	odd = binary.BigEndian.AppendUint32(odd, crc32.Checksum(odd, crc32.MakeTable(crc32.Castagnoli)))
	again, err := encoding.DecodeRecord(odd)
	require.NoError(t, err)
	require.Equal(t, rec, again)
	require.NotEqual(t, encoding.EncodeRecord(rec), odd)
	require.NoError(t, e.pdb.Set(ent.Key, odd, pebble.Sync)) // not through DB(): memory answers stay on
	e.cache.Delete(lockKey)

	require.Equal(t, driver.Replay, replay(t, e, k, "fp").Outcome) // uncached: read, then cached
	ent = cached(e, lockKey)
	require.NotNil(t, ent)
	require.Equal(t, odd, ent.Val, "the entry holds the stored bytes")
	require.True(t, ent.Matches(odd))
	hits := e.cacheHits.Load()
	res := replay(t, e, k, "fp")
	require.Equal(t, driver.Replay, res.Outcome)
	require.Equal(t, "result", string(res.Record.Result))
	require.Equal(t, hits+1, e.cacheHits.Load(), "answered by the cache")
}

// openFinished opens an engine with a 1 MiB replay cache and finishes the
// key s/k with fp and result: the engine, the key, its lock key and its
// cache entry.
func openFinished(t *testing.T, fp, result string) (*Engine, driver.Key, []byte, *rcache.Entry) {
	t.Helper()
	e := openMem(t, &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}, 1<<20)
	k := driver.Key{Scope: "s", ID: "k"}
	finishKey(t, e, k, fp, result)
	lockKey := keys.AppendLockKey(nil, k.Scope, k.ID)
	ent := cached(e, lockKey)
	require.NotNil(t, ent)
	return e, k, lockKey, ent
}
