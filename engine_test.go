package receipts_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/pebbleengine"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/receiptstore/receipts/reconcile"
	"github.com/stretchr/testify/require"
)

// otherEngine is the real Pebble engine seen only through driver.Engine, as
// the root sees an engine that is not Pebble (pgstore): the root cannot
// reach its Pebble-only methods.
type otherEngine struct{ driver.Engine }

// openOtherEngine opens a DB with OpenEngine on the Pebble engine (on an
// in-memory FS) hidden behind otherEngine.
func openOtherEngine(t *testing.T, opts *receipts.Options) (*receipts.DB, *pebbleengine.Engine) {
	t.Helper()
	var pe *pebbleengine.Engine
	db, err := receipts.OpenEngine(func(cfg driver.Config) (driver.Engine, error) {
		var err error
		pe, err = pebbleengine.Open("db", pebbleengine.Config{Config: cfg, Pebble: &pebble.Options{FS: vfs.NewMem()}})
		if err != nil {
			return nil, err
		}
		return otherEngine{pe}, nil
	}, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db, pe
}

func TestOpenEngineServesTheContract(t *testing.T) {
	clock := receiptstest.NewClock(receiptstest.DefaultStart)
	db, _ := openOtherEngine(t, &receipts.Options{Retention: time.Hour, LeaseTTL: time.Minute, GCInterval: -1, Now: clock.Now})
	ctx := context.Background()
	k := receipts.Key{Scope: "acct", ID: "op-1"}

	l, r, err := db.Claim(ctx, k, []byte("fp"))
	require.NoError(t, err)
	require.Nil(t, r)
	require.Equal(t, uint32(1), l.Attempt())
	_, _, err = db.Claim(ctx, k, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	_, _, err = db.Claim(ctx, k, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)

	got, err := l.Commit(ctx, []byte("done"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, got.State)
	require.Equal(t, clock.Now().Add(time.Hour), got.ExpiresAt)
	_, r, err = db.Claim(ctx, k, []byte("fp"))
	require.NoError(t, err)
	require.Equal(t, []byte("done"), r.Result)
	_, err = l.Commit(ctx, []byte("again"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)

	require.Equal(t, int64(1), countOf(t, db).Succeeded)
	st := db.Stats()
	require.Equal(t, uint64(1), st.Claims)
	require.Equal(t, uint64(1), st.Commits)
	require.Equal(t, uint64(1), st.Replays)
	require.Equal(t, time.Hour/4, db.Options().EpochWidth)
}

func TestOpenEngineUnsupportedPebbleOnlyMethods(t *testing.T) {
	db, _ := openOtherEngine(t, &receipts.Options{GCInterval: -1})
	ctx := context.Background()
	k := receipts.Key{Scope: "acct", ID: "op-1"}

	require.Nil(t, pebblestore.DB(db))
	require.ErrorIs(t, pebblestore.Checkpoint(db, t.TempDir()+"/cp"), receipts.ErrUnsupported)
	rep, err := db.Check(ctx) // the engine has no driver.Checker
	require.ErrorIs(t, err, receipts.ErrUnsupported)
	require.Nil(t, rep)
	_, err = pebblestore.DoBatch(ctx, db, k, []byte("fp"), func(context.Context, *receipts.Lease, *pebble.Batch) ([]byte, error) {
		t.Error("DoBatch ran fn on an engine without batches")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrUnsupported)

	l, _, err := db.Claim(ctx, k, []byte("fp"))
	require.NoError(t, err)
	_, err = pebblestore.CommitWith(ctx, l, []byte("r"), func(*pebble.Batch) error {
		t.Error("CommitWith ran its effect on an engine without batches")
		return nil
	})
	require.ErrorIs(t, err, receipts.ErrUnsupported)
	_, err = l.Commit(ctx, []byte("r")) // the lease is still held
	require.NoError(t, err)
}

func TestOpenEngineRejectsInvalidOptions(t *testing.T) {
	for name, o := range map[string]receipts.Options{
		"LeaseTTL": {Retention: time.Minute, LeaseTTL: time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := receipts.OpenEngine(func(driver.Config) (driver.Engine, error) {
				t.Error("the engine was opened with invalid options")
				return nil, errors.New("unreachable")
			}, &o)
			require.ErrorIs(t, err, receipts.ErrInvalidOptions)
		})
	}
}

// TestLeaseRawAndClaimWith: an engine package's own claim and commit
// (pgstore.DoTx, CommitTx) go through the root's bookkeeping.
func TestLeaseRawAndClaimWith(t *testing.T) {
	db, pe := openOtherEngine(t, &receipts.Options{GCInterval: -1})
	ctx := context.Background()
	k := receipts.Key{Scope: "acct", ID: "op-1"}

	claims := 0
	claim := func(ctx context.Context, e driver.Engine, req driver.ClaimRequest) (driver.ClaimResult, error) {
		claims++
		require.Equal(t, driver.Key(k), req.Key)
		require.Equal(t, receipts.DefaultLeaseTTL, req.LeaseTTL)
		return e.Claim(ctx, req)
	}
	l, _, err := db.ClaimWith(ctx, k, []byte("fp"), claim)
	require.NoError(t, err)
	require.Equal(t, 1, claims)
	_, _, err = db.ClaimWith(ctx, receipts.Key{Scope: "", ID: "x"}, []byte("fp"), claim)
	require.ErrorIs(t, err, receipts.ErrInvalidKey)
	require.Equal(t, 1, claims, "invalid input never reaches the engine")

	r, err := l.Raw(ctx, func(ctx context.Context, e driver.Engine, li driver.LeaseInfo) (*driver.Record, error) {
		require.Equal(t, driver.LeaseInfo{Key: driver.Key(k), Token: l.Token(), Attempts: 1}, li)
		require.Equal(t, otherEngine{pe}, e)
		return nil, nil // a fence check: nothing finished
	})
	require.NoError(t, err)
	require.Nil(t, r)
	r, err = l.Raw(ctx, func(ctx context.Context, e driver.Engine, li driver.LeaseInfo) (*driver.Record, error) {
		rec, err := e.Finish(ctx, li.Key, li.Token, driver.Succeeded, []byte("in tx"))
		return &rec, err
	})
	require.NoError(t, err)
	require.Equal(t, []byte("in tx"), r.Result)
	require.Equal(t, uint64(1), db.Stats().Commits)

	_, r, err = db.ClaimWith(ctx, k, []byte("fp"), claim)
	require.NoError(t, err)
	require.Equal(t, []byte("in tx"), r.Result, "a replay through ClaimWith")

	require.NoError(t, db.Close())
	_, err = l.Raw(ctx, func(context.Context, driver.Engine, driver.LeaseInfo) (*driver.Record, error) {
		t.Error("Raw ran fn after Close")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrClosed)
}

// An engine without driver.AttemptTaker (otherEngine hides the Pebble
// engine's) cannot take over one given attempt: TakeOver returns
// ErrUnsupported and writes nothing, and a Reconciler's passes report each
// claim as an error and leave it abandoned.
func TestTakeOverNeedsAnAttemptTaker(t *testing.T) {
	db, _ := openOtherEngine(t, &receipts.Options{GCInterval: -1})
	ctx := context.Background()
	k := receipts.Key{Scope: "acct", ID: "op-1"}
	l, _, err := db.Claim(ctx, k, []byte("fp"))
	require.NoError(t, err)
	require.NoError(t, l.Abandon(ctx))
	r, err := db.Lookup(ctx, k)
	require.NoError(t, err)
	_, err = db.TakeOver(ctx, r)
	require.ErrorIs(t, err, receipts.ErrUnsupported)

	rc, err := reconcile.New(db, reconcile.Options{Interval: -1,
		Check: func(context.Context, *receipts.Lease, *receipts.Receipt) ([]byte, error) {
			t.Error("Check must not run")
			return nil, nil
		}})
	require.NoError(t, err)
	defer rc.Close()
	st, err := rc.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Errors)
	require.Zero(t, st.Checked)
	after, err := db.Lookup(ctx, k)
	require.NoError(t, err)
	require.Equal(t, r.Token, after.Token)
	require.Equal(t, r.UpdatedAt, after.UpdatedAt)
}
