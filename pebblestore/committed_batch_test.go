package pebblestore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/pebblestore"
)

// TestBatchCommittedByTheApplication (issue 43, item 2): DoBatch's fn, or CommitWith's effect,
// that commits the batch itself (b.Commit) has made its writes durable without the receipt:
// the call fails with driver.ErrEffectEnded and ErrOutcomeUnknown (it used to make Pebble panic,
// "batch already committing", as the engine committed the batch again), no receipt is
// recorded, and the next attempt is Recovered at once.
func TestBatchCommittedByTheApplication(t *testing.T) {
	db := open(t, vfs.NewMem())
	defer db.Close()
	call := func(f func() error) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		return f()
	}
	check := func(t *testing.T, k receipts.Key, err error) {
		t.Helper()
		require.ErrorIs(t, err, driver.ErrEffectEnded)
		require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
		v, closer, gerr := pebblestore.DB(db).Get([]byte("app/" + k.ID))
		require.NoError(t, gerr, "the application's write is durable")
		require.Equal(t, "x", string(v))
		_ = closer.Close()
		l, r, err := db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err)
		require.Nil(t, r)
		require.True(t, l.Recovered())
		require.NoError(t, l.Abandon(bg))
	}
	t.Run("DoBatch", func(t *testing.T) {
		k := receipts.Key{Scope: "s", ID: "dobatch"}
		err := call(func() error {
			_, err := pebblestore.DoBatch(bg, db, k, []byte("fp"), func(_ context.Context, _ *receipts.Lease, b *pebble.Batch) ([]byte, error) {
				require.NoError(t, b.Set([]byte("app/"+k.ID), []byte("x"), nil))
				return []byte("ok"), b.Commit(pebble.Sync)
			})
			return err
		})
		check(t, k, err)
	})
	t.Run("CommitWith", func(t *testing.T) {
		k := receipts.Key{Scope: "s", ID: "commitwith"}
		l, _, err := db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err)
		err = call(func() error {
			_, err := pebblestore.CommitWith(bg, l, []byte("ok"), func(b *pebble.Batch) error {
				require.NoError(t, b.Set([]byte("app/"+k.ID), []byte("x"), nil))
				return b.Commit(pebble.Sync)
			})
			return err
		})
		check(t, k, err)
	})
}
