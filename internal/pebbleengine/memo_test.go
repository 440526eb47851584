package pebbleengine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/stretchr/testify/require"
)

// The memo of the last Pending record written (memo.go), on the real
// engine.

func claimKey(t *testing.T, e *Engine, k driver.Key, fp string) driver.ClaimResult {
	t.Helper()
	res, err := e.Claim(context.Background(), driver.ClaimRequest{Key: k, Fingerprint: []byte(fp), LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	require.Equal(t, driver.Claimed, res.Outcome)
	return res
}

// TestFinishDecidesFromMemo: a claim's commit decides from the memo of the
// claim's write, without reading Pebble: with the claimed record deleted
// behind the engine's back (its own handle, so the memo stays on), the
// commit still succeeds, and the memo entry is gone after it. Once the raw
// handle is handed out (DB), a commit reads Pebble: with the record deleted
// there, the lease is lost. Fails under the memoraw mutation.
func TestFinishDecidesFromMemo(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, -1) // no replay cache: the memo alone
	ctx := context.Background()
	var lk [keys.MaxLockKeyLen]byte

	k := driver.Key{Scope: "s", ID: "k"}
	res := claimKey(t, e, k, "A")
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	ent, ok := e.memo.get(lockKey)
	require.True(t, ok, "the claim's write is remembered")
	require.NoError(t, e.pdb.Delete(ent.key, pebble.Sync)) // not through DB(): the memo stays on
	_, err := e.Finish(ctx, k, res.Record.Token, driver.Succeeded, []byte("a"))
	require.NoError(t, err, "decided from the memo, Pebble not read")
	_, ok = e.memo.get(lockKey)
	require.False(t, ok, "a finished record is not remembered")
	rec, found, _, err := e.Lookup(ctx, k)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "a", string(rec.Result))

	_ = e.DB() // the caller may now write behind the engine's back
	k2 := driver.Key{Scope: "s", ID: "k2"}
	res = claimKey(t, e, k2, "A")
	ent, ok = e.memo.get(keys.AppendLockKey(lk[:0], k2.Scope, k2.ID))
	require.True(t, ok)
	require.NoError(t, e.pdb.Delete(ent.key, pebble.Sync))
	_, err = e.Finish(ctx, k2, res.Record.Token, driver.Succeeded, []byte("a"))
	require.ErrorIs(t, err, driver.ErrLeaseLost, "after DB(), the commit reads Pebble (the record is gone)")
}

// TestWriteDeletesMemo: every write of a key drops its memo entry first,
// under the key lock, so the next write decides from the record in force.
// With the replay cache off, a retry of a committed key reads the record
// under the key lock: it must find the commit, not the claim the memo held
// before it. A failed attempt's release, a renewal and a takeover each
// leave the memo holding what they wrote, or nothing. Fails under the
// memokeep mutation.
func TestWriteDeletesMemo(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, -1)
	ctx := context.Background()
	var lk [keys.MaxLockKeyLen]byte

	k := driver.Key{Scope: "s", ID: "k"}
	res := claimKey(t, e, k, "A")
	_, err := e.Finish(ctx, k, res.Record.Token, driver.Succeeded, []byte("a"))
	require.NoError(t, err)
	got := replay(t, e, k, "A")
	require.Equal(t, driver.Replay, got.Outcome, "the retry found the claim the memo held")
	require.Equal(t, "a", string(got.Record.Result))

	// A renewal rewrites the record: the memo holds the renewed one, whose
	// lease a retry reports.
	k2 := driver.Key{Scope: "s", ID: "k2"}
	res = claimKey(t, e, k2, "A")
	clk.Add(10 * time.Second)
	renewed, err := e.Renew(ctx, k2, res.Record.Token, 30*time.Second)
	require.NoError(t, err)
	got = replay(t, e, k2, "A")
	require.Equal(t, driver.InProgress, got.Outcome)
	require.True(t, got.Record.LeaseExpiresAt.Equal(renewed.LeaseExpiresAt), "in progress until %v, want the renewal's %v", got.Record.LeaseExpiresAt, renewed.LeaseExpiresAt)

	// The lease runs out and another caller takes the key over: the old
	// holder's commit must fail, although the memo held its claim once.
	clk.Add(time.Minute)
	over, err := e.Claim(ctx, driver.ClaimRequest{Key: k2, Fingerprint: []byte("A"), LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	require.Equal(t, driver.TookOver, over.Outcome)
	_, err = e.Finish(ctx, k2, res.Record.Token, driver.Succeeded, []byte("old"))
	require.ErrorIs(t, err, driver.ErrLeaseLost)
	_, err = e.Finish(ctx, k2, over.Record.Token, driver.Succeeded, []byte("new"))
	require.NoError(t, err)
	require.Equal(t, "new", string(replay(t, e, k2, "A").Record.Result))

	// A first attempt's release deletes the record: the key is free.
	k3 := driver.Key{Scope: "s", ID: "k3"}
	res = claimKey(t, e, k3, "A")
	require.NoError(t, e.Release(ctx, k3, res.Record.Token, false))
	_, ok := e.memo.get(keys.AppendLockKey(lk[:0], k3.Scope, k3.ID))
	require.False(t, ok)
	claimKey(t, e, k3, "B") // free again: a new claim, whatever the fingerprint
}

// TestMemoExpiredReadsPebble: a claim whose lease and record both ran out
// is decided from Pebble (the memo answers only for visible records), and
// the claim of the expired key is a new claim.
func TestMemoExpiredReadsPebble(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, -1)
	k := driver.Key{Scope: "s", ID: "k"}
	res := claimKey(t, e, k, "A")
	clk.Add(time.Hour) // retention ends exactly now
	_, err := e.Finish(context.Background(), k, res.Record.Token, driver.Succeeded, []byte("a"))
	require.ErrorIs(t, err, driver.ErrLeaseLost)
	again := claimKey(t, e, k, "B")
	require.Greater(t, again.Record.Token, res.Record.Token)
}

// TestMemoBounded: abandoned claims leave at most memoShards×memoPerShard
// entries, and every claim still commits (an evicted entry costs a read).
func TestMemoBounded(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	e := openMem(t, clk, -1)
	n := memoShards*memoPerShard + 500
	toks := make([]uint64, n)
	for i := range n {
		toks[i] = claimKey(t, e, driver.Key{Scope: "s", ID: fmt.Sprint(i)}, "A").Record.Token
	}
	require.LessOrEqual(t, e.memo.len(), memoShards*memoPerShard)
	require.Greater(t, e.memo.len(), memoShards*memoPerShard/2)
	for i := range n {
		_, err := e.Finish(context.Background(), driver.Key{Scope: "s", ID: fmt.Sprint(i)}, toks[i], driver.Succeeded, []byte("r"))
		require.NoError(t, err, "claim %d", i)
	}
	require.Zero(t, e.memo.len())
}
