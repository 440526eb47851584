package receiptstest

import (
	"context"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var claimTests = []test{
	{"CommitThenReplay", testClaimCommitReplay},
	{"ReplayNeverCallsFn", testReplayNeverCallsFn},
	{"IntentMismatch", testIntentMismatch},
	{"InProgress", testInProgress},
	{"FailIsReplayed", testFailIsReplayed},
	{"ScopesAndIDsDoNotMix", testKeysAreLengthPrefixed},
	{"RetryAfterEstimatesTheAnswer", testRetryAfterEstimate},
}

// A claim gives a lease; its commit is replayed, identical, to every retry
// (Claim, Lookup, Do); a committed lease is spent.
func testClaimCommitReplay(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("account-a", "approved-action-17")
	fp := "fp-1"

	claimedAt := e.clock.Now()
	l := e.claim(k, fp)
	require.Equal(t, k, l.Key())
	require.Equal(t, uint32(1), l.Attempt())
	require.False(t, l.Recovered())
	require.NotZero(t, l.Token())

	pending := e.visible(k, receipts.Pending)
	require.Equal(t, l.Token(), pending.Token)
	require.Equal(t, []byte(fp), pending.Fingerprint)
	require.Nil(t, pending.Result)
	require.Equal(t, uint32(1), pending.Attempts)
	require.True(t, claimedAt.Add(leaseTTL).Equal(pending.LeaseExpiresAt), "LeaseExpiresAt %s", pending.LeaseExpiresAt)
	require.False(t, pending.Abandoned(e.clock.Now()))

	e.clock.Advance(1234 * e.resolution()) // stored exactly: a whole multiple of the engine's resolution
	got, err := l.Commit(bg, []byte("item 1"))
	require.NoError(t, err)
	require.Equal(t, k, got.Key)
	require.Equal(t, receipts.Succeeded, got.State)
	require.Equal(t, []byte("item 1"), got.Result)
	require.Equal(t, []byte(fp), got.Fingerprint)
	require.Equal(t, l.Token(), got.Token)
	require.Equal(t, uint32(1), got.Attempts)
	require.True(t, got.CreatedAt.Equal(claimedAt), "CreatedAt %s", got.CreatedAt)
	require.True(t, got.UpdatedAt.Equal(e.clock.Now()), "UpdatedAt %s", got.UpdatedAt)
	require.True(t, got.ExpiresAt.Equal(e.clock.Now().Add(retention)), "ExpiresAt %s", got.ExpiresAt)
	require.True(t, got.LeaseExpiresAt.IsZero())
	require.False(t, got.Abandoned(e.clock.Now()))

	// A lost-response retry gets the stored receipt and no lease.
	e.clock.Advance(leaseTTL)
	sameReceipt(t, got, e.replay(k, fp))
	sameReceipt(t, got, e.replay(k, fp, receipts.WaitForResult()))
	sameReceipt(t, got, e.lookup(k))
	r, err := e.db.Do(bg, k, []byte(fp), mustNotRun(t))
	require.NoError(t, err)
	sameReceipt(t, got, r)

	// A receipt is the caller's own: changing it changes no later replay.
	r.Result[0], r.Fingerprint[0] = 'X', 'X'
	got.Result[1] = 'X'
	sameReceipt(t, e.replay(k, fp), e.lookup(k))
	require.Equal(t, []byte("item 1"), e.replay(k, fp).Result)
	require.Equal(t, []byte(fp), e.lookup(k).Fingerprint)
	got = e.lookup(k)

	// The committed lease is spent, and the receipt is unchanged.
	_, err = l.Commit(bg, []byte("again"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	_, err = l.Fail(bg, []byte("again"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.ErrorIs(t, l.Renew(bg), receipts.ErrLeaseLost)
	require.ErrorIs(t, l.Release(bg), receipts.ErrLeaseLost)
	require.ErrorIs(t, l.Abandon(bg), receipts.ErrLeaseLost)
	sameReceipt(t, got, e.lookup(k))
	e.wantCounts(counts{Succeeded: 1})
}

// Replays of a finished operation, Succeeded or Failed, never call fn and
// return the stored receipt, however often they come.
func testReplayNeverCallsFn(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	calls := 0
	fn := func(context.Context, *receipts.Lease) ([]byte, error) {
		calls++
		return []byte("effect"), nil
	}
	first, err := e.db.Do(bg, k, []byte("fp"), fn)
	require.NoError(t, err)
	for range 5 {
		e.clock.Advance(leaseTTL)
		r, err := e.db.Do(bg, k, []byte("fp"), fn)
		require.NoError(t, err)
		sameReceipt(t, first, r)
	}
	require.Equal(t, 1, calls)

	kf := key("a", "failed")
	failed, err := e.db.Do(bg, kf, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		calls++
		return []byte("declined"), receipts.Permanent(context.Canceled)
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	for range 3 {
		r, err := e.db.Do(bg, kf, []byte("fp"), fn)
		require.ErrorIs(t, err, receipts.ErrFailed)
		sameReceipt(t, failed, r)
	}
	require.Equal(t, 2, calls)
}

// The same key with another fingerprint is refused whatever the record's
// state, and changes nothing.
func testIntentMismatch(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp-1")
	before := e.lookup(k)

	// Pending: same key, different intent.
	_, _, err := e.db.Claim(bg, k, []byte("fp-2"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	_, _, err = e.db.Claim(bg, k, []byte("fp-2"), receipts.WaitForResult())
	require.ErrorIs(t, err, receipts.ErrIntentMismatch, "no waiting for a request that can never succeed")
	_, err = e.db.Do(bg, k, []byte("fp-2"), mustNotRun(t))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	sameReceipt(t, before, e.lookup(k))

	got, err := l.Commit(bg, []byte("ok"))
	require.NoError(t, err)

	// Committed: still refused, and the receipt is unchanged.
	l2, r2, err := e.db.Claim(bg, k, []byte("fp-2"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	require.Nil(t, l2)
	require.Nil(t, r2, "a mismatch exposes nothing")
	r, err := e.db.Do(bg, k, []byte("fp-2"), mustNotRun(t))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	require.Nil(t, r)
	sameReceipt(t, got, e.lookup(k))
	require.Equal(t, []byte("fp-1"), e.lookup(k).Fingerprint)

	// Failed.
	kf := key("a", "failed")
	_, err = e.claim(kf, "fp-1").Fail(bg, []byte("no"))
	require.NoError(t, err)
	_, _, err = e.db.Claim(bg, kf, []byte("fp-2"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)

	// Abandoned claims too (a lease that ran out, and one given up).
	k2 := key("a", "k2")
	e.claim(k2, "x")
	e.clock.Advance(leaseTTL)
	_, _, err = e.db.Claim(bg, k2, []byte("y"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	k3 := key("a", "k3")
	require.NoError(t, e.claim(k3, "x").Abandon(bg))
	_, _, err = e.db.Claim(bg, k3, []byte("y"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	r3 := e.lookup(k3)
	require.Equal(t, uint32(1), r3.Attempts, "a refused claim takes nothing over")
	require.Equal(t, []byte("x"), r3.Fingerprint)
}

// While a live lease is held, Claim answers *InProgressError at once (or
// after a bounded wait) and changes nothing.
func testInProgress(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	before := e.lookup(k)
	e.clock.Advance(10 * time.Second)

	ip := e.inProgress(k, "fp")
	require.LessOrEqual(t, ip.RetryAfter, 20*time.Second, "no later than the lease runs out")
	require.Contains(t, ip.Error(), "k")
	sameReceipt(t, before, e.lookup(k))

	// Live until exactly LeaseExpiresAt.
	e.clock.Advance(20*time.Second - 1)
	ip = e.inProgress(k, "fp")
	require.LessOrEqual(t, ip.RetryAfter, time.Duration(1))

	// A bounded wait ends with the in-progress error and the context's (the context
	// leaves the engine time to answer once).
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, _, err := e.db.Claim(ctx, k, []byte("fp"), receipts.WaitForResult())
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorAs(t, err, &ip)
	ctx, cancel = context.WithCancel(bg)
	cancel()
	_, err = e.db.Do(ctx, k, []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, context.Canceled)
	sameReceipt(t, before, e.lookup(k))

	_, err = l.Commit(bg, []byte("done"))
	require.NoError(t, err)
}

// A Failed receipt is replayed like a success, with ErrFailed from Do.
func testFailIsReplayed(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	r, err := l.Fail(bg, []byte("card declined"))
	require.NoError(t, err)
	require.Equal(t, receipts.Failed, r.State)
	require.Equal(t, []byte("card declined"), r.Result)
	require.Equal(t, l.Token(), r.Token)

	sameReceipt(t, r, e.replay(k, "fp"))
	sameReceipt(t, r, e.lookup(k))
	r3, err := e.db.Do(bg, k, []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, receipts.ErrFailed)
	sameReceipt(t, r, r3)
	_, err = l.Commit(bg, []byte("after all"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	e.wantCounts(counts{Failed: 1})
}

// Keys whose parts concatenate to the same bytes are different keys, and a
// Scan of one scope lists only that scope.
func testKeysAreLengthPrefixed(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	for _, k := range []receipts.Key{key("ab", "c"), key("a", "bc"), key("a\x00", "b"), key("a", "\x00b")} {
		r, err := e.db.Do(bg, k, []byte("fp-"+k.Scope+"|"+k.ID), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte(k.Scope + "|" + k.ID), nil
		})
		require.NoError(t, err)
		require.Equal(t, k.Scope+"|"+k.ID, string(r.Result))
	}
	n := 0
	for r, err := range e.db.Scan(bg, receipts.Filter{Scope: "a"}) {
		require.NoError(t, err)
		require.Equal(t, "a", r.Key.Scope)
		require.Equal(t, r.Key.Scope+"|"+r.Key.ID, string(r.Result))
		n++
	}
	require.Equal(t, 2, n)
}

// RetryAfter estimates when the answer will be there, from the engine's
// recent operation durations, bounded by the lease: after operations that
// take about 100ms, a retry of one just started is told well under the
// lease (not the lease's remaining time, which renewal keeps near
// LeaseTTL). Elsewhere the kit asserts only 0 < RetryAfter <= the lease's
// remaining time.
func testRetryAfterEstimate(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	for i := range 20 {
		_, err := e.db.Do(bg, key("a", "warm-"+string(rune('a'+i))), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			e.clock.Advance(100 * time.Millisecond)
			return []byte("ok"), nil
		})
		require.NoError(t, err)
	}
	k := key("a", "k")
	l := e.claim(k, "fp")
	ip := e.inProgress(k, "fp")
	require.Less(t, ip.RetryAfter, leaseTTL/4, "RetryAfter %s for operations of 100ms", ip.RetryAfter)

	// Bounded by the lease.
	e.clock.Advance(leaseTTL - time.Millisecond)
	ip = e.inProgress(k, "fp")
	require.LessOrEqual(t, ip.RetryAfter, time.Millisecond)
	_, err := l.Commit(bg, []byte("done"))
	require.NoError(t, err)
}
