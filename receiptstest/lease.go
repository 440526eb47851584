package receiptstest

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var leaseTests = []test{
	{"TakeoverAfterExpiry", testTakeoverAfterExpiry},
	{"StaleHolderWritesNothing", testStaleHolderWritesNothing},
	{"ExpiredHolderMayCommitIfNobodyTookOver", testExpiredHolderMayCommit},
	{"RenewExtendsTheLease", testRenewExtendsTheLease},
	{"ReleaseFreesTheKey", testReleaseFreesTheKey},
	{"AbandonHandsOverAtOnce", testAbandonHandsOverAtOnce},
	{"ProviderKey", testProviderKey},
	{"KeepAlive", testLeaseKeepAlive},
	{"ReleaseOfRecoveredLeaseKeepsRecovered", testReleaseRecoveredKeepsRecovered},
}

// A lease is live while now < LeaseExpiresAt; then the next claim takes
// the key over: Recovered, Attempt 2, a larger token, the same provider key.
func testTakeoverAfterExpiry(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	old := e.claim(k, "fp")

	e.clock.Advance(leaseTTL - 1)
	e.inProgress(k, "fp")
	e.clock.Advance(1)
	require.True(t, e.lookup(k).Abandoned(e.clock.Now()))
	cur := e.claim(k, "fp")
	require.True(t, cur.Recovered())
	require.Equal(t, uint32(2), cur.Attempt())
	require.Greater(t, cur.Token(), old.Token())
	require.Equal(t, old.ProviderKey(), cur.ProviderKey())
	require.Equal(t, k, cur.Key())

	r := e.visible(k, receipts.Pending)
	require.Equal(t, cur.Token(), r.Token)
	require.Equal(t, uint32(2), r.Attempts)
	require.False(t, r.Abandoned(e.clock.Now()))
	e.inProgress(k, "fp") // the new lease is live

	// A third attempt after the second holder also vanished.
	e.clock.Advance(leaseTTL)
	third := e.claim(k, "fp")
	require.True(t, third.Recovered())
	require.Equal(t, uint32(3), third.Attempt())
	require.Greater(t, third.Token(), cur.Token())
	got, err := third.Commit(bg, []byte("fresh"))
	require.NoError(t, err)
	require.Equal(t, uint32(3), got.Attempts)
	require.Equal(t, third.Token(), got.Token)
}

// A holder whose key was taken over can neither renew, commit, fail,
// release nor abandon: ErrLeaseLost, and nothing is written.
func testStaleHolderWritesNothing(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	old := e.claim(k, "fp")
	e.clock.Advance(leaseTTL)
	cur := e.claim(k, "fp")
	before := e.lookup(k)

	e.clock.Advance(time.Second)
	require.ErrorIs(t, old.Renew(bg), receipts.ErrLeaseLost)
	_, err := old.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	_, err = old.Fail(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.ErrorIs(t, old.Release(bg), receipts.ErrLeaseLost)
	require.ErrorIs(t, old.Abandon(bg), receipts.ErrLeaseLost)
	sameReceipt(t, before, e.lookup(k))
	e.inProgress(k, "fp") // the current holder's lease is untouched

	r, err := cur.Commit(bg, []byte("fresh"))
	require.NoError(t, err)
	require.Equal(t, uint32(2), r.Attempts)
	_, err = old.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	sameReceipt(t, r, e.lookup(k))
}

// Fencing is by token, not by time: a holder whose lease ran out but that
// nobody took over may still renew and commit.
func testExpiredHolderMayCommit(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	e.clock.Advance(5 * time.Minute)
	require.NoError(t, l.Renew(bg))
	e.inProgress(k, "fp")
	r, err := l.Commit(bg, []byte("late but fine"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, r.State)
	require.Equal(t, uint32(1), r.Attempts)

	k2 := key("a", "k2")
	l2 := e.claim(k2, "fp")
	e.clock.Advance(time.Hour - time.Minute) // far past the lease, within retention
	r, err = l2.Commit(bg, []byte("late, not renewed"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, r.State)
}

// Renew moves LeaseExpiresAt to now + LeaseTTL and keeps others out.
func testRenewExtendsTheLease(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	for range 5 {
		e.clock.Advance(20 * time.Second)
		require.NoError(t, l.Renew(bg))
		r := e.lookup(k)
		require.True(t, r.LeaseExpiresAt.Equal(e.clock.Now().Add(leaseTTL)), "LeaseExpiresAt %s", r.LeaseExpiresAt)
		require.Equal(t, l.Token(), r.Token)
		require.Equal(t, uint32(1), r.Attempts)
		e.inProgress(k, "fp")
	}
	e.clock.Advance(leaseTTL - 1)
	e.inProgress(k, "fp")
	_, err := l.Commit(bg, []byte("done"))
	require.NoError(t, err)
}

// Release deletes the claim: the key starts afresh, even with another
// intent, with a new token.
func testReleaseFreesTheKey(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	require.NoError(t, l.Release(bg))
	e.gone(k)
	e.wantCounts(counts{})

	// A released claim leaves no record: even another intent may claim.
	l2 := e.claim(k, "other")
	require.Equal(t, uint32(1), l2.Attempt())
	require.False(t, l2.Recovered())
	require.Greater(t, l2.Token(), l.Token(), "tokens are never reused")
	require.Equal(t, l.ProviderKey(), l2.ProviderKey())
	require.ErrorIs(t, l.Release(bg), receipts.ErrLeaseLost)
	_, err := l.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.Equal(t, []byte("other"), e.lookup(k).Fingerprint)
}

// Abandon ends the lease at once and keeps the claim: the next caller takes
// over without waiting for the lease, Recovered.
func testAbandonHandsOverAtOnce(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	o := e.db.Options()
	require.Equal(t, retention, o.Retention)
	require.Equal(t, leaseTTL, o.LeaseTTL)

	k := key("a", "k")
	l := e.claim(k, "fp")
	e.clock.Advance(time.Second)
	require.NoError(t, l.Abandon(bg))
	r := e.visible(k, receipts.Pending)
	require.True(t, r.Abandoned(e.clock.Now()), "abandoned at once, no waiting for the lease")
	require.True(t, r.UpdatedAt.Equal(e.clock.Now()), "an abandon is a write")
	e.wantCounts(counts{Pending: 1, Abandoned: 1})

	l2 := e.claim(k, "fp")
	require.True(t, l2.Recovered())
	require.Equal(t, uint32(2), l2.Attempt())
	require.Greater(t, l2.Token(), l.Token())
	require.ErrorIs(t, l.Abandon(bg), receipts.ErrLeaseLost)
	_, err := l2.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)
}

// ProviderKey is at most 64 characters of [A-Za-z0-9_-], reveals neither
// scope nor ID, differs between keys and is stable across attempts.
func testProviderKey(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	valid := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	seen := map[string]bool{}
	for _, k := range []receipts.Key{key("acct-secret", "op-1"), key("acct-secret", "op-2"), key("other", "op-1"), key("op-1", "other")} {
		l := e.claim(k, "fp")
		pk := l.ProviderKey()
		require.Regexp(t, valid, pk)
		require.NotContains(t, pk, k.Scope)
		require.NotContains(t, pk, k.ID)
		require.False(t, seen[pk], "distinct keys get distinct provider keys")
		seen[pk] = true
		require.NoError(t, l.Release(bg))
		l2 := e.claim(k, "fp")
		require.Equal(t, pk, l2.ProviderKey(), "after a release")
		require.NoError(t, l2.Abandon(bg))
		l3 := e.claim(k, "fp")
		require.Equal(t, pk, l3.ProviderKey(), "after a takeover")
	}
}

// KeepAlive renews in the background; a takeover ends the effect's context
// with ErrLeaseLost. (Renewal runs on the wall clock: the lease is 30ms.)
func testLeaseKeepAlive(t *testing.T, s Store) {
	e := newEnv(t, s, func(o *receipts.Options) { o.LeaseTTL = 30 * time.Millisecond })
	k := key("a", "k")
	l := e.claim(k, "fp")
	ctx, cancel := context.WithCancelCause(bg)
	defer cancel(nil)
	stop := l.KeepAlive(cancel)
	defer stop()

	// Renewals keep the lease live past its first expiry.
	first := e.lookup(k)
	e.clock.Advance(time.Second)
	require.Eventually(t, func() bool {
		cur, err := e.db.Lookup(bg, k)
		return err == nil && cur.LeaseExpiresAt.After(first.LeaseExpiresAt)
	}, 10*time.Second, time.Millisecond)

	// A takeover ends the effect's context with ErrLeaseLost. (A renewal
	// can land between the clock jump and the claim: jump again.)
	var thief *receipts.Lease
	require.Eventually(t, func() bool {
		e.clock.Advance(time.Minute)
		var err error
		thief, _, err = e.db.Claim(bg, k, []byte("fp"))
		return err == nil && thief != nil
	}, 10*time.Second, time.Millisecond)
	require.True(t, thief.Recovered())
	select {
	case <-ctx.Done():
		require.ErrorIs(t, context.Cause(ctx), receipts.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("KeepAlive never noticed the lost lease")
	}
	stop()
	_, err := thief.Commit(bg, []byte("thief"))
	require.NoError(t, err)
}

// A Recovered lease that is released keeps the next attempt Recovered:
// the earlier attempt's outcome is still unknown. Across a restart too,
// and until something definitive is recorded.
func testReleaseRecoveredKeepsRecovered(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	first := e.claim(k, "fp")
	require.NoError(t, first.Abandon(bg))
	second := e.claim(k, "fp")
	require.True(t, second.Recovered())
	require.NoError(t, second.Release(bg))

	third := e.claim(k, "fp")
	require.True(t, third.Recovered(), "released after a takeover: the first attempt's outcome is still unknown")
	require.GreaterOrEqual(t, third.Attempt(), uint32(2))
	require.Greater(t, third.Token(), second.Token())
	require.Equal(t, first.ProviderKey(), third.ProviderKey())
	_, _, err := e.db.Claim(bg, k, []byte("other intent"))
	require.Error(t, err, "the unknown outcome still guards the key's intent")
	require.NoError(t, third.Release(bg))

	e.reopen()
	fourth := e.claim(k, "fp")
	require.True(t, fourth.Recovered(), "after a restart")
	r, err := fourth.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)
	sameReceipt(t, r, e.replay(k, "fp"))

	// A lease that was never Recovered still frees the key for a fresh start.
	k2 := key("a", "clean")
	require.NoError(t, e.claim(k2, "fp").Release(bg))
	l := e.claim(k2, "fp")
	require.False(t, l.Recovered())
	require.Equal(t, uint32(1), l.Attempt())
}
