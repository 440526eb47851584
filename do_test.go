package receipts_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

func TestDoOutcomes(t *testing.T) {
	s := newTestStore(t, nil)
	fp := []byte("fp")

	t.Run("success", func(t *testing.T) {
		k := key("a", "ok")
		r, err := s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			return []byte("result"), nil
		})
		require.NoError(t, err)
		require.Equal(t, receipts.Succeeded, r.State)
		require.Equal(t, []byte("result"), r.Result)
	})

	t.Run("not performed releases", func(t *testing.T) {
		k := key("a", "np")
		cause := errors.New("validation failed before any effect")
		r, err := s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			return nil, receipts.NotPerformed(cause)
		})
		require.Nil(t, r)
		require.ErrorIs(t, err, cause)
		_, err = s.db.Lookup(bg, k)
		require.ErrorIs(t, err, receipts.ErrNotFound)
		l, _, err := s.db.Claim(bg, k, fp)
		require.NoError(t, err)
		require.False(t, l.Recovered())
		require.NoError(t, l.Release(bg))
	})

	t.Run("permanent is stored as Failed", func(t *testing.T) {
		k := key("a", "perm")
		cause := errors.New("card declined")
		r, err := s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			return []byte(`{"error":"declined"}`), receipts.Permanent(cause)
		})
		require.ErrorIs(t, err, receipts.ErrFailed)
		require.ErrorIs(t, err, cause)
		require.Equal(t, receipts.Failed, r.State)
		require.Equal(t, []byte(`{"error":"declined"}`), r.Result)

		r2, err := s.db.Do(bg, k, fp, nil)
		require.ErrorIs(t, err, receipts.ErrFailed)
		require.Equal(t, r.Result, r2.Result)
	})

	t.Run("unknown outcome abandons", func(t *testing.T) {
		k := key("a", "unknown")
		cause := errors.New("provider timed out")
		r, err := s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			return nil, cause
		})
		require.Nil(t, r)
		require.ErrorIs(t, err, cause)
		got, err := s.db.Lookup(bg, k)
		require.NoError(t, err)
		require.Equal(t, receipts.Pending, got.State)
		require.True(t, got.Abandoned(s.clock.Now()), "abandoned at once, no waiting for the lease")

		var recovered bool
		var attempt uint32
		r, err = s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			recovered, attempt = l.Recovered(), l.Attempt()
			return []byte("reconciled"), nil
		})
		require.NoError(t, err)
		require.True(t, recovered)
		require.Equal(t, uint32(2), attempt)
		require.Equal(t, []byte("reconciled"), r.Result)
	})

	t.Run("panic abandons and re-panics", func(t *testing.T) {
		k := key("a", "panic")
		require.PanicsWithValue(t, "boom", func() {
			_, _ = s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
				panic("boom")
			})
		})
		var recovered bool
		_, err := s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			recovered = l.Recovered()
			return []byte("x"), nil
		})
		require.NoError(t, err)
		require.True(t, recovered)
	})

	t.Run("oversized result abandons", func(t *testing.T) {
		k := key("a", "big")
		_, err := s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			return make([]byte, receipts.MaxResultSize+1), nil
		})
		require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
		got, err := s.db.Lookup(bg, k)
		require.NoError(t, err)
		require.True(t, got.Abandoned(s.clock.Now()), "the effect may have happened: reconcile")
	})
}

func TestDoConcurrentSameKeyRunsOnce(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "hot")
	var calls atomic.Int32
	release := make(chan struct{})
	const n = 16
	var wg sync.WaitGroup
	results := make([][]byte, n)
	errs := make([]error, n) // checked by the test goroutine after wg.Wait
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
				calls.Add(1)
				<-release
				return []byte("once"), nil
			})
			if errs[i] = err; err == nil {
				results[i] = r.Result
			}
		}()
	}
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond) // wait until one caller runs fn
	}
	close(release)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), calls.Load())
	for _, r := range results {
		require.Equal(t, []byte("once"), r)
	}
}

func TestDoCommitsAfterCallerGoesAway(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	ctx, cancel := context.WithCancel(bg)
	r, err := s.db.Do(ctx, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		cancel() // the client disconnects right after the effect
		return []byte("effect done"), nil
	})
	require.NoError(t, err)
	require.Equal(t, []byte("effect done"), r.Result)
	got, err := s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, got.State)
}

func TestDoRenewsLeaseInBackground(t *testing.T) {
	s := newTestStore(t, func(o *pebblestore.Options) { o.LeaseTTL = 30 * time.Millisecond })
	k := key("a", "slow")
	r, err := s.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		first, err := s.db.Lookup(bg, k)
		require.NoError(t, err)
		s.clock.Advance(time.Second) // far past the first lease
		deadline := time.Now().Add(10 * time.Second)
		for {
			cur, err := s.db.Lookup(bg, k)
			require.NoError(t, err)
			if cur.LeaseExpiresAt.After(first.LeaseExpiresAt) {
				break // renewed by Do's background renewer
			}
			require.True(t, time.Now().Before(deadline), "lease never renewed")
			time.Sleep(time.Millisecond)
		}
		_, _, err = s.db.Claim(bg, k, []byte("fp"))
		require.ErrorIs(t, err, receipts.ErrInProgress, "a renewed lease is live")
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Attempts)
}

func TestDoLeaseLostCancelsFn(t *testing.T) {
	s := newTestStore(t, func(o *pebblestore.Options) { o.LeaseTTL = 30 * time.Millisecond })
	k := key("a", "k")
	_, err := s.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		// Another caller takes over (our renewals can't keep up with a
		// clock that jumps a minute).
		s.clock.Advance(time.Minute)
		thief, _, err := s.db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err)
		require.True(t, thief.Recovered())
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), receipts.ErrLeaseLost)
		return []byte("too late"), nil
	})
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
}

func TestDoWaitsForHolderAndReplays(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	var r *receipts.Receipt
	done := make(chan error, 1)
	go func() {
		var err error
		r, err = s.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			t.Error("fn must not run: the holder committed")
			return nil, nil
		})
		done <- err // checked by the test goroutine
	}()
	_, err = l.Commit(bg, []byte("from holder"))
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, []byte("from holder"), r.Result)
}

func TestDoBatchCommitsEffectWithReceipt(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "item")
	runs := 0
	fn := func(ctx context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error) {
		runs++
		return []byte("item-1"), b.Set([]byte("app/items/1"), []byte("Review evals"), nil)
	}
	r, err := pebblestore.DoBatch(bg, s.db, k, []byte("fp"), fn)
	require.NoError(t, err)
	require.Equal(t, []byte("item-1"), r.Result)
	r, err = pebblestore.DoBatch(bg, s.db, k, []byte("fp"), fn)
	require.NoError(t, err)
	require.Equal(t, []byte("item-1"), r.Result)
	require.Equal(t, 1, runs)
	v, closer, err := pebblestore.DB(s.db).Get([]byte("app/items/1"))
	require.NoError(t, err)
	require.Equal(t, "Review evals", string(v))
	closer.Close()

	// An error discards the batch.
	k2 := key("a", "item2")
	_, err = pebblestore.DoBatch(bg, s.db, k2, []byte("fp"), func(ctx context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error) {
		_ = b.Set([]byte("app/items/2"), []byte("nope"), nil)
		return nil, receipts.NotPerformed(errors.New("invalid"))
	})
	require.Error(t, err)
	_, _, err = pebblestore.DB(s.db).Get([]byte("app/items/2"))
	require.ErrorIs(t, err, pebble.ErrNotFound)
}

func TestCommitWith(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)

	boom := errors.New("effect failed")
	_, err = pebblestore.CommitWith(bg, l, []byte("r"), func(b *pebble.Batch) error {
		_ = b.Set([]byte("app/x"), []byte("half"), nil)
		return boom
	})
	require.ErrorIs(t, err, boom)
	_, _, err = pebblestore.DB(s.db).Get([]byte("app/x"))
	require.ErrorIs(t, err, pebble.ErrNotFound, "nothing written")
	got, err := s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, receipts.Pending, got.State, "the lease is still held")

	r, err := pebblestore.CommitWith(bg, l, []byte("r"), func(b *pebble.Batch) error {
		return b.Set([]byte("app/x"), []byte("whole"), nil)
	})
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, r.State)
	v, closer, err := pebblestore.DB(s.db).Get([]byte("app/x"))
	require.NoError(t, err)
	require.Equal(t, "whole", string(v))
	closer.Close()
}

func TestBeforeReplay(t *testing.T) {
	denied := errors.New("caller no longer authorized")
	var deny atomic.Bool
	s := newTestStore(t, func(o *pebblestore.Options) {
		o.BeforeReplay = func(ctx context.Context, r *receipts.Receipt) error {
			if deny.Load() {
				return denied
			}
			return nil
		}
	})
	k := key("a", "k")
	_, err := s.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("secret result"), nil
	})
	require.NoError(t, err, "a first execution is not a replay")

	deny.Store(true)
	l, r, err := s.db.Claim(bg, k, []byte("fp"))
	require.ErrorIs(t, err, denied)
	require.Nil(t, l)
	require.Nil(t, r)
	r, err = s.db.Do(bg, k, []byte("fp"), nil)
	require.ErrorIs(t, err, denied)
	require.Nil(t, r)
	r, err = s.db.Lookup(bg, k)
	require.ErrorIs(t, err, denied)
	require.Nil(t, r)

	deny.Store(false)
	r, err = s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, []byte("secret result"), r.Result)
}
