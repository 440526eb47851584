package receipts_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

func TestClaimCommitReplay(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("account-a", "approved-action-17")
	fp := []byte("fp-1")

	l, r, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.Nil(t, r)
	require.Equal(t, k, l.Key())
	require.Equal(t, uint32(1), l.Attempt())
	require.False(t, l.Recovered())
	require.NotZero(t, l.Token())

	got, err := l.Commit(bg, []byte("item 1"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, got.State)
	require.Equal(t, []byte("item 1"), got.Result)
	require.Equal(t, l.Token(), got.Token)
	require.Equal(t, s.clock.Now().Add(time.Hour), got.ExpiresAt)

	// A lost-response retry gets the stored result and no lease.
	l2, r2, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.Nil(t, l2)
	require.Equal(t, got.Result, r2.Result)
	require.Equal(t, receipts.Succeeded, r2.State)

	r3, err := s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, got.Result, r3.Result)
	require.Equal(t, fp, r3.Fingerprint)

	calls := 0
	r4, err := s.db.Do(bg, k, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
		calls++
		return []byte("second effect"), nil
	})
	require.NoError(t, err)
	require.Zero(t, calls, "a replay never calls fn")
	require.Equal(t, got.Result, r4.Result)

	// The committed lease is spent.
	_, err = l.Commit(bg, []byte("again"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
}

func TestIntentMismatch(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp-1"))
	require.NoError(t, err)

	// Pending: same key, different intent.
	_, _, err = s.db.Claim(bg, k, []byte("fp-2"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	_, err = s.db.Do(bg, k, []byte("fp-2"), func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Fatal("fn must not run")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)

	_, err = l.Commit(bg, []byte("ok"))
	require.NoError(t, err)

	// Committed: still rejected, and the receipt is unchanged.
	_, _, err = s.db.Claim(bg, k, []byte("fp-2"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	r, err := s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, []byte("fp-1"), r.Fingerprint)
	require.Equal(t, []byte("ok"), r.Result)

	// Abandoned claims too.
	k2 := key("a", "k2")
	_, _, err = s.db.Claim(bg, k2, []byte("x"))
	require.NoError(t, err)
	s.clock.Advance(time.Minute)
	_, _, err = s.db.Claim(bg, k2, []byte("y"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
}

func TestInProgress(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	_, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	s.clock.Advance(10 * time.Second)

	_, _, err = s.db.Claim(bg, k, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	var ip *receipts.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Equal(t, 20*time.Second, ip.RetryAfter)
	require.Equal(t, k, ip.Key)

	// A bounded wait ends with the in-progress error and the context's.
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	_, _, err = s.db.Claim(ctx, k, []byte("fp"), receipts.WaitForResult())
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestWaitForResultWakesOnCommitAndRelease(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)

	type out struct {
		l   *receipts.Lease
		r   *receipts.Receipt
		err error
	}
	waiters := make(chan out, 4)
	for range 4 {
		go func() {
			l, r, err := s.db.Claim(bg, k, []byte("fp"), receipts.WaitForResult())
			waiters <- out{l, r, err}
		}()
	}
	_, err = l.Commit(bg, []byte("done"))
	require.NoError(t, err)
	for range 4 {
		o := <-waiters
		require.NoError(t, o.err)
		require.Nil(t, o.l)
		require.Equal(t, []byte("done"), o.r.Result)
	}

	// Release: exactly one waiter gets the key, the others keep waiting
	// for that one's outcome.
	k2 := key("a", "k2")
	l, _, err = s.db.Claim(bg, k2, []byte("fp"))
	require.NoError(t, err)
	for range 3 {
		go func() {
			l, r, err := s.db.Claim(bg, k2, []byte("fp"), receipts.WaitForResult())
			if l != nil {
				_, err = l.Commit(bg, []byte("by waiter")) // checked by the test goroutine
			}
			waiters <- out{l, r, err}
		}()
	}
	require.NoError(t, l.Release(bg))
	leases := 0
	for range 3 {
		o := <-waiters
		require.NoError(t, o.err)
		if o.l != nil {
			leases++
			require.Equal(t, uint32(1), o.l.Attempt())
			require.False(t, o.l.Recovered())
		} else {
			require.Equal(t, []byte("by waiter"), o.r.Result)
		}
	}
	require.Equal(t, 1, leases)
}

func TestWaitForResultTakesOverExpiredLease(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	_, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	var l *receipts.Lease
	done := make(chan error, 1)
	go func() {
		var err error
		l, _, err = s.db.Claim(bg, k, []byte("fp"), receipts.WaitForResult())
		done <- err // checked by the test goroutine: require would Goexit here
	}()
	s.clock.Advance(31 * time.Second) // the holder died: nobody renews
	require.NoError(t, <-done)
	require.True(t, l.Recovered())
	require.Equal(t, uint32(2), l.Attempt())
}

func TestTakeoverAndFencing(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	fp := []byte("fp")
	old, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)

	s.clock.Advance(30 * time.Second) // live while now < LeaseExpiresAt: now it has run out
	cur, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.True(t, cur.Recovered())
	require.Equal(t, uint32(2), cur.Attempt())
	require.Greater(t, cur.Token(), old.Token())
	require.Equal(t, old.ProviderKey(), cur.ProviderKey())

	// The stale holder can do nothing.
	require.ErrorIs(t, old.Renew(bg), receipts.ErrLeaseLost)
	_, err = old.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	_, err = old.Fail(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	effectRan := false
	_, err = pebblestore.CommitWith(bg, old, []byte("stale"), func(b *pebble.Batch) error {
		effectRan = true
		return b.Set([]byte("app/stale"), []byte("x"), nil)
	})
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.False(t, effectRan)
	require.ErrorIs(t, old.Release(bg), receipts.ErrLeaseLost)
	_, closer, err := pebblestore.DB(s.db).Get([]byte("app/stale"))
	require.ErrorIs(t, err, pebble.ErrNotFound)
	if closer != nil {
		closer.Close()
	}

	r, err := cur.Commit(bg, []byte("fresh"))
	require.NoError(t, err)
	require.Equal(t, uint32(2), r.Attempts)
}

func TestExpiredHolderMayCommitIfNobodyTookOver(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	s.clock.Advance(5 * time.Minute)
	require.NoError(t, l.Renew(bg))
	r, err := l.Commit(bg, []byte("late but fine"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, r.State)
}

func TestReleaseFreesTheKey(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	require.NoError(t, l.Release(bg))
	_, err = s.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound)

	// A released claim leaves no record: even another intent may claim.
	l2, _, err := s.db.Claim(bg, k, []byte("other"))
	require.NoError(t, err)
	require.Equal(t, uint32(1), l2.Attempt())
	require.False(t, l2.Recovered())
	require.Greater(t, l2.Token(), l.Token(), "tokens are never reused")
	require.ErrorIs(t, l.Release(bg), receipts.ErrLeaseLost)
}

func TestFailIsReplayed(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	r, err := l.Fail(bg, []byte("card declined"))
	require.NoError(t, err)
	require.Equal(t, receipts.Failed, r.State)

	_, r2, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	require.Equal(t, receipts.Failed, r2.State)
	require.Equal(t, []byte("card declined"), r2.Result)

	r3, err := s.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Fatal("fn must not run")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, receipts.Failed, r3.State)
}

func TestConcurrentClaimsOneWinner(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	const n = 32
	var wg sync.WaitGroup
	var mu sync.Mutex
	var leases, inProgress int
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, _, err := s.db.Claim(bg, k, []byte("fp"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && l != nil:
				leases++
			case errors.Is(err, receipts.ErrInProgress):
				inProgress++
			default:
				t.Errorf("unexpected: %v", err)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, leases)
	require.Equal(t, n-1, inProgress)
}

func TestTokensUniqueAcrossReleaseAndRestart(t *testing.T) {
	s := newTestStore(t, nil)
	seen := map[uint64]bool{}
	last := uint64(0)
	for i := range 50 {
		k := key("a", "same")
		l, _, err := s.db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err)
		require.False(t, seen[l.Token()])
		require.Greater(t, l.Token(), last)
		seen[l.Token()], last = true, l.Token()
		require.NoError(t, l.Release(bg))
		if i%10 == 9 {
			s.reopen()
		}
	}
}

func TestWaitAtMost(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)

	// The bound passes: a plain in-progress answer with a fresh RetryAfter,
	// not the context's error.
	_, _, err = s.db.Claim(bg, k, []byte("fp"), receipts.WaitAtMost(20*time.Millisecond))
	var ip *receipts.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Equal(t, 30*time.Second, ip.RetryAfter)
	require.NotErrorIs(t, err, context.DeadlineExceeded)

	// The holder commits within the bound: the waiter gets the receipt.
	var r *receipts.Receipt
	done := make(chan error, 1)
	go func() {
		var err error
		_, r, err = s.db.Claim(bg, k, []byte("fp"), receipts.WaitAtMost(time.Minute))
		done <- err // checked by the test goroutine
	}()
	_, err = l.Commit(bg, []byte("done"))
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, []byte("done"), r.Result)
}
