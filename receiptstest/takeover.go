package receiptstest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// DB.TakeOver: the fenced takeover of exactly one listed abandoned claim.
var takeOverTests = []test{
	{"TakesOverTheListedAttempt", testTakeOverListed},
	{"RefusedOnceAnotherAttemptCameIn", testTakeOverSuperseded},
	{"RefusedOnceSettled", testTakeOverSettled},
	{"LiveLeaseIsInProgress", testTakeOverLive},
	{"SettleEachWay", testTakeOverSettleEachWay},
	{"OneWinnerAmongConcurrent", testTakeOverConcurrent},
	{"LeaseFor", testTakeOverLeaseFor},
	{"BadInputChangesNothing", testTakeOverBadInput},
	{"AfterClose", testTakeOverAfterClose},
}

// abandoned claims k and abandons it, then returns its listing from
// Scan(Filter{Abandoned: true}).
func (e *env) abandoned(k receipts.Key, fp string) *receipts.Receipt {
	e.t.Helper()
	l := e.claim(k, fp)
	require.NoError(e.t, l.Abandon(bg))
	return e.listed(k)
}

// listed returns k's entry in Scan(Filter{Abandoned: true}).
func (e *env) listed(k receipts.Key) *receipts.Receipt {
	e.t.Helper()
	var got *receipts.Receipt
	for r, err := range e.db.Scan(bg, receipts.Filter{Scope: k.Scope, Abandoned: true}) {
		require.NoError(e.t, err)
		if r.Key == k {
			got = r
		}
	}
	require.NotNil(e.t, got, "%s is not listed as abandoned", k)
	return got
}

// The listed attempt is taken over: a Recovered lease with one more
// attempt and a new token, the same ProviderKey; then it is that attempt
// no more, and a second TakeOver of the listing is refused.
func testTakeOverListed(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	first := e.claim(k, "fp")
	require.NoError(t, first.Abandon(bg))
	r := e.listed(k)
	require.Equal(t, first.Token(), r.Token)

	l, err := e.db.TakeOver(bg, r)
	require.NoError(t, err)
	require.True(t, l.Recovered())
	require.Equal(t, uint32(2), l.Attempt())
	require.Greater(t, l.Token(), r.Token)
	require.Equal(t, first.ProviderKey(), l.ProviderKey())
	require.Equal(t, k, l.Key())
	require.Equal(t, leaseTTL, l.TTL())
	cur := e.visible(k, receipts.Pending)
	require.Equal(t, l.Token(), cur.Token)
	require.Equal(t, []byte("fp"), cur.Fingerprint)
	require.True(t, cur.LeaseExpiresAt.Equal(e.clock.Now().Add(leaseTTL)), "LeaseExpiresAt %s", cur.LeaseExpiresAt)
	e.inProgress(k, "fp")

	_, err = e.db.TakeOver(bg, r)
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	_, err = first.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	got, err := l.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)
	require.Equal(t, uint32(2), got.Attempts)
	e.wantCounts(counts{Succeeded: 1})
}

// A claim that took the key over after the listing (and abandoned it in
// its turn) makes TakeOver of the listing fail and change nothing.
func testTakeOverSuperseded(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	r := e.abandoned(k, "fp")
	e.clock.Advance(time.Second)
	other := e.claim(k, "fp")
	require.True(t, other.Recovered())
	require.NoError(t, other.Abandon(bg))
	before := e.lookup(k)
	require.True(t, before.Abandoned(e.clock.Now()))

	e.clock.Advance(time.Second)
	l, err := e.db.TakeOver(bg, r)
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.Nil(t, l)
	sameReceipt(t, before, e.lookup(k))

	// The fresh listing can be taken over.
	l, err = e.db.TakeOver(bg, e.listed(k))
	require.NoError(t, err)
	require.Equal(t, uint32(3), l.Attempt())
	require.NoError(t, l.Abandon(bg))
}

// A listing whose claim was since committed, failed, forgotten, released or
// left past retention is refused; the store is unchanged.
func testTakeOverSettled(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	settle := map[string]func(l *receipts.Lease){
		"commit": func(l *receipts.Lease) { _, err := l.Commit(bg, []byte("ok")); require.NoError(t, err) },
		"fail":   func(l *receipts.Lease) { _, err := l.Fail(bg, []byte("no")); require.NoError(t, err) },
		"forget": func(l *receipts.Lease) { require.NoError(t, l.Forget(bg)) },
	}
	for name, fn := range settle {
		k := key("a", name)
		r := e.abandoned(k, "fp")
		l := e.claim(k, "fp") // a client's retry came first
		fn(l)
		before, _ := e.db.Lookup(bg, k)
		_, err := e.db.TakeOver(bg, r)
		require.ErrorIs(t, err, receipts.ErrLeaseLost, name)
		if before != nil {
			sameReceipt(t, before, e.lookup(k))
		} else {
			e.gone(k)
		}
	}
	// A first attempt released (never abandoned): the listing is of a live
	// claim; once released, the record is gone.
	k := key("a", "released")
	l := e.claim(k, "fp")
	r := e.lookup(k)
	require.NoError(t, l.Release(bg))
	_, err := e.db.TakeOver(bg, r)
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	e.gone(k)

	// Past retention the listing is of nothing.
	k = key("a", "old")
	r = e.abandoned(k, "fp")
	e.clock.Advance(retention)
	_, err = e.db.TakeOver(bg, r)
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	e.gone(k)
}

// The listed attempt with a live lease (not abandoned yet, or renewed by
// its holder since the listing) is in progress: nothing is written.
func testTakeOverLive(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	r := e.lookup(k)
	_, err := e.db.TakeOver(bg, r)
	require.ErrorIs(t, err, receipts.ErrInProgress)
	var ip *receipts.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Equal(t, k, ip.Key)
	require.Positive(t, ip.RetryAfter)
	require.LessOrEqual(t, ip.RetryAfter, leaseTTL)
	sameReceipt(t, r, e.lookup(k))

	// Its lease runs out, it is listed, then its holder renews (fencing is
	// by token: it may): the listing is live again.
	e.clock.Advance(leaseTTL)
	r = e.listed(k)
	require.NoError(t, l.Renew(bg))
	before := e.lookup(k)
	_, err = e.db.TakeOver(bg, r)
	require.ErrorIs(t, err, receipts.ErrInProgress)
	sameReceipt(t, before, e.lookup(k))
	_, err = l.Commit(bg, []byte("holder finished"))
	require.NoError(t, err)
}

// Each way of settling a taken-over claim: Commit and Fail leave a
// receipt, Forget frees the key, Abandon leaves it abandoned for a later
// check (listed again, with the new token).
func testTakeOverSettleEachWay(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	take := func(k receipts.Key) *receipts.Lease {
		t.Helper()
		l, err := e.db.TakeOver(bg, e.abandoned(k, "fp"))
		require.NoError(t, err)
		return l
	}
	l := take(key("a", "commit"))
	r, err := l.Commit(bg, []byte("it happened"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, r.State)
	sameReceipt(t, r, e.replay(key("a", "commit"), "fp"))

	l = take(key("a", "fail"))
	r, err = l.Fail(bg, []byte("declined"))
	require.NoError(t, err)
	require.Equal(t, receipts.Failed, r.State)

	l = take(key("a", "forget"))
	require.NoError(t, l.Forget(bg))
	e.gone(key("a", "forget"))
	fresh := e.claim(key("a", "forget"), "other intent")
	require.False(t, fresh.Recovered())
	require.NoError(t, fresh.Release(bg))

	k := key("a", "unknown")
	l = take(k)
	require.NoError(t, l.Abandon(bg))
	again := e.listed(k)
	require.Equal(t, l.Token(), again.Token)
	l2, err := e.db.TakeOver(bg, again)
	require.NoError(t, err)
	require.Equal(t, uint32(3), l2.Attempt())
	require.NoError(t, l2.Forget(bg))
	e.wantCounts(counts{Succeeded: 1, Failed: 1})
}

// Concurrent TakeOvers of one listing, and claims racing them: exactly one
// lease among them all.
func testTakeOverConcurrent(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	for round := range 5 {
		k := key("a", "k"+string(rune('0'+round)))
		r := e.abandoned(k, "fp")
		const n = 8
		var wg sync.WaitGroup
		leases := make(chan *receipts.Lease, 2*n)
		errs := make(chan error, 2*n)
		for i := range 2 * n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var l *receipts.Lease
				var err error
				if i%2 == 0 {
					l, err = e.db.TakeOver(bg, r)
				} else {
					l, _, err = e.db.Claim(bg, k, []byte("fp"))
				}
				if err != nil {
					errs <- err
					return
				}
				leases <- l
			}()
		}
		wg.Wait()
		close(leases)
		close(errs)
		require.Len(t, leases, 1, "round %d: one lease", round)
		for err := range errs {
			if !errors.Is(err, receipts.ErrLeaseLost) && !errors.Is(err, receipts.ErrInProgress) {
				require.Failf(t, "unexpected error", "round %d: %v", round, err)
			}
		}
		l := <-leases
		require.Equal(t, uint32(2), l.Attempt())
		require.NoError(t, l.Forget(bg))
	}
}

// TakeOver with LeaseFor holds the claim for that long.
func testTakeOverLeaseFor(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	const long = 10 * time.Minute
	l, err := e.db.TakeOver(bg, e.abandoned(k, "fp"), receipts.LeaseFor(long))
	require.NoError(t, err)
	require.Equal(t, long, l.TTL())
	require.True(t, e.lookup(k).LeaseExpiresAt.Equal(e.clock.Now().Add(long)))
	e.clock.Advance(long - tick)
	e.inProgressFor(k, "fp")
	require.NoError(t, l.Forget(bg))
}

// Bad input: a nil receipt, a zero token, an invalid key, a LeaseFor out of
// bounds: an error, and nothing is written.
func testTakeOverBadInput(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	r := e.abandoned(k, "fp")
	before := e.lookup(k)
	_, err := e.db.TakeOver(bg, nil)
	require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	zero := *r
	zero.Token = 0
	_, err = e.db.TakeOver(bg, &zero)
	require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	bad := *r
	bad.Key.ID = ""
	_, err = e.db.TakeOver(bg, &bad)
	require.ErrorIs(t, err, receipts.ErrInvalidKey)
	_, err = e.db.TakeOver(bg, r, receipts.LeaseFor(0))
	require.ErrorIs(t, err, receipts.ErrInvalidOptions)
	_, err = e.db.TakeOver(bg, r, receipts.LeaseFor(retention))
	require.ErrorIs(t, err, receipts.ErrInvalidOptions)
	sameReceipt(t, before, e.lookup(k))
}

// After Close, TakeOver returns ErrClosed.
func testTakeOverAfterClose(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	r := e.abandoned(key("a", "k"), "fp")
	require.NoError(t, e.db.Close())
	_, err := e.db.TakeOver(bg, r)
	require.ErrorIs(t, err, receipts.ErrClosed)
}
