package receiptstest

import (
	"context"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// Tests of the Pebble-only methods (Lease.CommitWith, DB.DoBatch, DB.Pebble).
// They skip on an engine whose DB.Pebble returns nil.
//
// TODO: once receipts.ErrUnsupported exists (DESIGN.md, "One contract,
// several engines"), check there that CommitWith and DoBatch return it.
var pebbleTests = []test{
	{"CommitWith", testCommitWith},
	{"CommitWithStaleLease", testCommitWithStale},
	{"DoBatch", testDoBatch},
	{"ApplicationDataAlongside", testApplicationData},
	{"UseAfterClose", testPebbleUseAfterClose},
}

// newPebbleEnv is newEnv for the Pebble-only tests: it skips the test on
// another engine.
func newPebbleEnv(t *testing.T, s Store) *env {
	e := newEnv(t, s, nil)
	if !e.isPebble() {
		t.Skip("the engine does not serve the Pebble-only methods (DB.Pebble() == nil)")
	}
	return e
}

// pebbleGet reads an application key: its value, or "" and false.
func pebbleGet(t *testing.T, db *receipts.DB, k string) (string, bool) {
	t.Helper()
	v, closer, err := pebblestore.DB(db).Get([]byte(k))
	if errors.Is(err, pebble.ErrNotFound) {
		return "", false
	}
	require.NoError(t, err)
	defer closer.Close()
	return string(v), true
}

// CommitWith: the effect commits with the receipt; an effect error writes
// nothing and leaves the lease held.
func testCommitWith(t *testing.T, s Store) {
	e := newPebbleEnv(t, s)
	k := key("a", "k")
	l := e.claim(k, "fp")

	boom := errors.New("effect failed")
	_, err := pebblestore.CommitWith(bg, l, []byte("r"), func(b *pebble.Batch) error {
		_ = b.Set([]byte("app/x"), []byte("half"), nil)
		return boom
	})
	require.ErrorIs(t, err, boom)
	_, ok := pebbleGet(t, e.db, "app/x")
	require.False(t, ok, "nothing written")
	require.Equal(t, receipts.Pending, e.lookup(k).State, "the lease is still held")

	r, err := pebblestore.CommitWith(bg, l, []byte("r"), func(b *pebble.Batch) error {
		return b.Set([]byte("app/x"), []byte("whole"), nil)
	})
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, r.State)
	v, ok := pebbleGet(t, e.db, "app/x")
	require.True(t, ok)
	require.Equal(t, "whole", v)
	sameReceipt(t, r, e.replay(k, "fp"))

	e.reopen()
	v, ok = pebbleGet(t, e.db, "app/x")
	require.True(t, ok, "the effect survives a restart with its receipt")
	require.Equal(t, "whole", v)
	sameReceipt(t, r, e.lookup(k))
}

// A stale holder's CommitWith: ErrLeaseLost, the effect is not even called.
func testCommitWithStale(t *testing.T, s Store) {
	e := newPebbleEnv(t, s)
	k := key("a", "k")
	old := e.claim(k, "fp")
	e.clock.Advance(leaseTTL)
	cur := e.claim(k, "fp")
	effectRan := false
	_, err := pebblestore.CommitWith(bg, old, []byte("stale"), func(b *pebble.Batch) error {
		effectRan = true
		return b.Set([]byte("app/stale"), []byte("x"), nil)
	})
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.False(t, effectRan)
	_, ok := pebbleGet(t, e.db, "app/stale")
	require.False(t, ok)
	require.Equal(t, cur.Token(), e.lookup(k).Token)
}

// DoBatch: the effect commits with the receipt, once; an error discards the
// batch.
func testDoBatch(t *testing.T, s Store) {
	e := newPebbleEnv(t, s)
	k := key("a", "item")
	runs := 0
	fn := func(ctx context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error) {
		runs++
		return []byte("item-1"), b.Set([]byte("app/items/1"), []byte("Review evals"), nil)
	}
	r, err := pebblestore.DoBatch(bg, e.db, k, []byte("fp"), fn)
	require.NoError(t, err)
	require.Equal(t, []byte("item-1"), r.Result)
	r2, err := pebblestore.DoBatch(bg, e.db, k, []byte("fp"), fn)
	require.NoError(t, err)
	sameReceipt(t, r, r2)
	require.Equal(t, 1, runs)
	v, ok := pebbleGet(t, e.db, "app/items/1")
	require.True(t, ok)
	require.Equal(t, "Review evals", v)

	for _, fnErr := range []error{
		receipts.NotPerformed(errors.New("invalid")),
		receipts.Permanent(errors.New("declined")),
		errors.New("unknown"),
	} {
		k2 := key("a", "item2-"+fnErr.Error())
		_, err = pebblestore.DoBatch(bg, e.db, k2, []byte("fp"), func(ctx context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error) {
			_ = b.Set([]byte("app/items/2"), []byte("nope"), nil)
			return nil, fnErr
		})
		require.Error(t, err)
		_, ok = pebbleGet(t, e.db, "app/items/2")
		require.False(t, ok, "%v: the batch is discarded", fnErr)
	}
}

// The application's keys (anything outside the reserved prefix) are never
// seen by the store, across a restart.
func testApplicationData(t *testing.T, s Store) {
	e := newPebbleEnv(t, s)
	_, err := e.db.Do(bg, key("a", "k"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("x"), nil
	})
	require.NoError(t, err)
	for _, k := range []string{"", "\x00", "\x00rcps", "\x00rcpu", "\xff", "app/1"} {
		require.NoError(t, pebblestore.DB(e.db).Set([]byte(k+"x"), []byte("app"), pebble.Sync))
	}
	e.wantCounts(counts{Succeeded: 1})
	e.reopen()
	e.lookup(key("a", "k"))
	e.wantCounts(counts{Succeeded: 1})
	v, ok := pebbleGet(t, e.db, "app/1x")
	require.True(t, ok)
	require.Equal(t, "app", v)
}

// DoBatch and Checkpoint after Close: ErrClosed.
func testPebbleUseAfterClose(t *testing.T, s Store) {
	e := newPebbleEnv(t, s)
	l := e.claim(key("a", "k"), "fp")
	require.NoError(t, e.db.Close())
	_, err := pebblestore.DoBatch(bg, e.db, key("a", "k"), []byte("fp"), nil)
	require.ErrorIs(t, err, receipts.ErrClosed)
	require.ErrorIs(t, pebblestore.Checkpoint(e.db, "cp"), receipts.ErrClosed)
	_, err = pebblestore.CommitWith(bg, l, nil, func(*pebble.Batch) error { return nil })
	require.ErrorIs(t, err, receipts.ErrClosed)
}
