package pebbleengine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/stretchr/testify/require"
)

// TestClaimProbeUsesBottomLevelFilters: once a store's records sit in the
// bottom level (L6), the probe for a new key (a claim's, here a lookup's:
// both read through readInto) is answered by L6's Bloom filter,
// not by reading an L6 index and data block. Pebble's Get never consults
// L6 filters, so a probe through Get leaves the filter counters unchanged
// and this test fails. Present keys are still found, in L6 and in the
// memtable.
func TestClaimProbeUsesBottomLevelFilters(t *testing.T) {
	ctx := context.Background()
	e := openMem(t, &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}, 1<<20)

	// Keys of present records are even, new keys odd: every new key falls
	// inside the L6 table's key range, where only its filter can rule it out.
	key := func(i int) driver.Key { return driver.Key{Scope: "t", ID: fmt.Sprintf("op-%06d", i)} }
	const n = 2000
	for i := range n {
		finishKey(t, e, key(2*i), "fp", "ok")
	}
	pending := func(i int) {
		res, err := e.Claim(ctx, driver.ClaimRequest{Key: key(i), Fingerprint: []byte("fp"), LeaseTTL: time.Minute})
		require.NoError(t, err)
		require.Equal(t, driver.Claimed, res.Outcome, "key %d", i)
	}
	pending(2 * n) // a record no cache holds, read through the probe
	require.NoError(t, e.pdb.Flush())
	require.NoError(t, e.pdb.Compact(ctx, []byte{0}, []byte{0xff}, true))
	m := e.pdb.Metrics()
	require.Zero(t, m.Levels[0].TablesCount, "everything compacted below L0")
	require.NotZero(t, m.Levels[6].TablesCount, "records in L6")

	before := m.Filter
	for i := range n { // new keys: every live epoch probed, all absent
		_, found, _, err := e.Lookup(ctx, key(2*i+1))
		require.NoError(t, err)
		require.False(t, found)
	}
	after := e.pdb.Metrics().Filter
	require.GreaterOrEqual(t, after.Hits-before.Hits, int64(n*9/10),
		"absent keys answered by L6's Bloom filters (hits %d -> %d, misses %d -> %d)",
		before.Hits, after.Hits, before.Misses, after.Misses)

	for _, i := range []int{0, n, 2*n - 2} { // in L6
		r, found, _, err := e.Lookup(ctx, key(i))
		require.NoError(t, err)
		require.True(t, found, "key %d", i)
		require.Equal(t, "ok", string(r.Result))
	}
	pending(2*n + 2) // in the memtable
	for _, i := range []int{2 * n, 2*n + 2} {
		r, found, _, err := e.Lookup(ctx, key(i))
		require.NoError(t, err)
		require.True(t, found, "key %d", i)
		require.Equal(t, driver.Pending, r.State)
	}
	finishKey(t, e, key(2*n+1), "fp", "ok") // finished, in the memtable
	r, found, _, err := e.Lookup(ctx, key(2*n+1))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "ok", string(r.Result))
}

// TestCachedReplayProbesNewerEpochs: a retry of a receipt whose bytes the
// cache does not hold, an epoch after it was written, is answered through
// the cache once the newer epoch is found empty (probed through the
// prober); a record of the key in the newer epoch (written behind the
// engine's back, with another result) makes the cache step aside, and the
// retry gets the newer record.
func TestCachedReplayProbesNewerEpochs(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, 64<<10) // budget/64 = 1 KiB: the 2 KiB result is not held
	k := driver.Key{Scope: "s", ID: "big"}
	finishKey(t, e, k, "A", string(make([]byte, 2048)))
	var lk [keys.MaxLockKeyLen]byte
	ent := cached(e, keys.AppendLockKey(lk[:0], k.Scope, k.ID))
	require.NotNil(t, ent)
	require.Nil(t, ent.Val)

	clk.Add(15 * time.Minute) // the next epoch; the receipt is still visible
	hi := e.epochOf(e.now())
	require.Greater(t, hi, ent.Epoch)
	hits := e.cacheHits.Load()
	require.Equal(t, driver.Replay, replay(t, e, k, "A").Outcome)
	require.Equal(t, hits+1, e.cacheHits.Load(), "answered through the cache")

	v, closer, err := e.pdb.Get(ent.Key)
	require.NoError(t, err)
	var rec encoding.Record
	require.NoError(t, encoding.DecodeRecordInto(&rec, v))
	require.NoError(t, closer.Close())
	rec.Result = []byte("newer")
	require.NoError(t, e.pdb.Set(keys.AppendRecord(nil, hi, k.Scope, k.ID), encoding.EncodeRecord(&rec), pebble.Sync))
	res := replay(t, e, k, "A")
	require.Equal(t, driver.Replay, res.Outcome)
	require.Equal(t, "newer", string(res.Record.Result), "the newest record answers")
	require.Equal(t, hits+1, e.cacheHits.Load(), "not through the stale entry")
}
