package pebblestore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// now is the stores' clock: the tests move it past a lease.
var now atomic.Int64

func init() { now.Store(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC).UnixNano()) }

func open(t *testing.T, fs vfs.FS) *receipts.DB {
	t.Helper()
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{Retention: time.Hour, LeaseTTL: time.Minute, GCInterval: -1,
			Now: func() time.Time { return time.Unix(0, now.Load()) }},
		Pebble: &pebble.Options{FS: fs},
	})
	require.NoError(t, err)
	return db
}

// DoBatch's claim is not synced (it guards only the batch, which commits
// synced with the receipt), but a claim made inside its fn, for another key,
// guards an effect of its own and must be synced: the unit the batch travels
// in is bound to DoBatch's lease once fn runs. A power loss while the inner
// effect runs must leave the inner claim, so that the next attempt is told
// its outcome is unknown (Recovered) instead of running it as new.
func TestDoBatchNestedClaimIsSynced(t *testing.T) {
	mem := vfs.NewCrashableMem()
	db := open(t, mem)
	var crashed *vfs.MemFS
	outer, inner := receipts.Key{Scope: "s", ID: "outer"}, receipts.Key{Scope: "s", ID: "inner"}
	_, err := pebblestore.DoBatch(bg, db, outer, []byte("fp"), func(ctx context.Context, _ *receipts.Lease, b *pebble.Batch) ([]byte, error) {
		require.NoError(t, b.Set([]byte("app/outer"), []byte("x"), nil))
		_, err := db.Do(ctx, inner, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			crashed = mem.CrashClone(vfs.CrashCloneCfg{}) // the power fails while the inner effect runs
			return []byte("inner"), nil
		})
		return []byte("outer"), err
	})
	require.NoError(t, err)
	require.NoError(t, db.Close())

	db = open(t, crashed)
	defer db.Close()
	now.Add(int64(2 * time.Minute)) // the crashed attempt's lease runs out
	l, r, err := db.Claim(bg, inner, []byte("fp"))
	require.NoError(t, err)
	require.Nil(t, r)
	require.True(t, l.Recovered(), "the inner claim was lost in the power failure: its effect would run again as new")
	require.NoError(t, l.Abandon(bg))
}

// The batch DoBatch's fn fills commits with the Succeeded receipt, and only
// with it: a Permanent failure stores a Failed receipt without it, and a
// replay never calls fn.
func TestDoBatchCommitsTheBatchWithTheReceipt(t *testing.T) {
	db := open(t, vfs.NewMem())
	defer db.Close()
	pdb := pebblestore.DB(db)
	get := func(k string) bool {
		_, closer, err := pdb.Get([]byte(k))
		if errors.Is(err, pebble.ErrNotFound) {
			return false
		}
		require.NoError(t, err)
		require.NoError(t, closer.Close())
		return true
	}
	k := receipts.Key{Scope: "s", ID: "ok"}
	for range 2 {
		r, err := pebblestore.DoBatch(bg, db, k, []byte("fp"), func(_ context.Context, _ *receipts.Lease, b *pebble.Batch) ([]byte, error) {
			require.False(t, get("app/ok"), "fn ran on a replay")
			return []byte("done"), b.Set([]byte("app/ok"), []byte("1"), nil)
		})
		require.NoError(t, err)
		require.Equal(t, receipts.Succeeded, r.State)
		require.True(t, get("app/ok"))
	}
	k = receipts.Key{Scope: "s", ID: "failed"}
	_, err := pebblestore.DoBatch(bg, db, k, []byte("fp"), func(_ context.Context, _ *receipts.Lease, b *pebble.Batch) ([]byte, error) {
		require.NoError(t, b.Set([]byte("app/failed"), []byte("1"), nil))
		return nil, receipts.Permanent(errors.New("declined"))
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.False(t, get("app/failed"), "a Failed receipt was written with the batch")
}
