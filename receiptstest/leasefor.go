package receiptstest

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// Per-claim lease lengths (receipts.LeaseFor): the engine keeps each
// claim's own lease, renewals extend it by its own length, and a takeover
// waits for it.
var leaseForTests = []test{
	{"ClaimHoldsForItsOwnLength", testLeaseForClaim},
	{"ShorterThanTheDefault", testLeaseForShorter},
	{"RenewExtendsByItsLength", testLeaseForRenew},
	{"TakeoverGetsItsOwnLength", testLeaseForTakeover},
	{"SurvivesARestart", testLeaseForRestart},
	{"OutOfBoundsIsRefused", testLeaseForBounds},
	{"DoHoldsForItsLength", testLeaseForDo},
	{"DoRenewsByItsLength", testLeaseForDoRenews},
	{"RetryAfterFollowsIt", testLeaseForRetryAfter},
}

// tick is the smallest step of time every engine keeps apart: PostgreSQL
// stores microseconds.
const tick = time.Microsecond

// inProgressFor claims k and requires *InProgressError whose RetryAfter is
// positive and at most the holder's remaining lease.
func (e *env) inProgressFor(k receipts.Key, fp string) *receipts.InProgressError {
	e.t.Helper()
	l, r, err := e.db.Claim(bg, k, []byte(fp))
	require.ErrorIs(e.t, err, receipts.ErrInProgress, "claim %s", k)
	require.Nil(e.t, l)
	require.Nil(e.t, r)
	var ip *receipts.InProgressError
	require.ErrorAs(e.t, err, &ip)
	require.Positive(e.t, ip.RetryAfter)
	cur := e.lookup(k)
	require.LessOrEqual(e.t, ip.RetryAfter, cur.LeaseExpiresAt.Sub(e.clock.Now()), "never past the holder's lease")
	return ip
}

// A claim with LeaseFor(10m) holds the key for 10 minutes, far past the
// store's 30s LeaseTTL: LeaseExpiresAt is now + 10m, and only then does
// the next claim take over (with the store's own lease length).
func testLeaseForClaim(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const long = 10 * time.Minute
	k := key("a", "export")
	l := e.claim(k, "fp", receipts.LeaseFor(long))
	require.Equal(t, long, l.TTL())
	r := e.visible(k, receipts.Pending)
	require.True(t, r.LeaseExpiresAt.Equal(e.clock.Now().Add(long)), "LeaseExpiresAt %s, want now + %s", r.LeaseExpiresAt, long)

	e.clock.Advance(leaseTTL) // the store's default lease would be over
	require.False(t, e.lookup(k).Abandoned(e.clock.Now()))
	e.inProgressFor(k, "fp")
	e.clock.Advance(long - leaseTTL - tick)
	e.inProgressFor(k, "fp")
	e.clock.Advance(tick)
	require.True(t, e.lookup(k).Abandoned(e.clock.Now()))
	next := e.claim(k, "fp")
	require.True(t, next.Recovered())
	require.Equal(t, uint32(2), next.Attempt())
	require.Equal(t, leaseTTL, next.TTL(), "a takeover without LeaseFor gets Options.LeaseTTL")
	r = e.lookup(k)
	require.True(t, r.LeaseExpiresAt.Equal(e.clock.Now().Add(leaseTTL)), "LeaseExpiresAt %s", r.LeaseExpiresAt)
	_, err := l.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	_, err = next.Commit(bg, []byte("done"))
	require.NoError(t, err)
}

// A lease shorter than the default runs out sooner: the next claim takes
// over after 2s, not 30s.
func testLeaseForShorter(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "quick")
	l := e.claim(k, "fp", receipts.LeaseFor(2*time.Second))
	e.clock.Advance(2*time.Second - tick)
	e.inProgressFor(k, "fp")
	e.clock.Advance(tick)
	next := e.claim(k, "fp")
	require.True(t, next.Recovered())
	require.Greater(t, next.Token(), l.Token())
	require.NoError(t, next.Release(bg))
}

// Renew extends a LeaseFor lease to now + its own length, whether longer
// or shorter than the store's LeaseTTL.
func testLeaseForRenew(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	for _, d := range []time.Duration{5 * time.Minute, 3 * time.Second} {
		k := key("a", d.String())
		l := e.claim(k, "fp", receipts.LeaseFor(d))
		for range 3 {
			e.clock.Advance(d / 2)
			require.NoError(t, l.Renew(bg))
			r := e.lookup(k)
			require.True(t, r.LeaseExpiresAt.Equal(e.clock.Now().Add(d)), "%s: LeaseExpiresAt %s, want now + %s", d, r.LeaseExpiresAt, d)
			e.inProgressFor(k, "fp")
		}
		e.clock.Advance(d - tick)
		e.inProgressFor(k, "fp")
		e.clock.Advance(tick)
		next := e.claim(k, "fp")
		require.True(t, next.Recovered(), "%s: taken over once its renewed lease ran out", d)
		require.NoError(t, next.Release(bg))
	}
}

// The caller that takes an abandoned claim over gets the lease length it
// asks for, not the earlier holder's.
func testLeaseForTakeover(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const long = 20 * time.Minute
	k := key("a", "k")
	first := e.claim(k, "fp")
	require.NoError(t, first.Abandon(bg))
	second := e.claim(k, "fp", receipts.LeaseFor(long))
	require.True(t, second.Recovered())
	require.Equal(t, long, second.TTL())
	r := e.lookup(k)
	require.True(t, r.LeaseExpiresAt.Equal(e.clock.Now().Add(long)), "LeaseExpiresAt %s", r.LeaseExpiresAt)
	e.clock.Advance(long - tick)
	e.inProgressFor(k, "fp")
	got, err := second.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)
	require.Equal(t, uint32(2), got.Attempts)
}

// The lease's end is stored with the claim: after a restart the key is
// still held for the rest of the claim's own lease.
func testLeaseForRestart(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const long = 15 * time.Minute
	k := key("a", "k")
	e.claim(k, "fp", receipts.LeaseFor(long))
	e.clock.Advance(time.Minute)
	e.reopen()
	e.inProgressFor(k, "fp")
	e.clock.Advance(long - time.Minute - tick)
	e.inProgressFor(k, "fp")
	e.clock.Advance(tick)
	next := e.claim(k, "fp")
	require.True(t, next.Recovered())
	require.NoError(t, next.Release(bg))
}

// LeaseFor must be positive and less than Retention: Claim and Do refuse
// anything else with ErrInvalidOptions, write nothing and run nothing.
func testLeaseForBounds(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	for _, d := range []time.Duration{0, -1, -time.Hour, retention, retention + 1, math.MaxInt64, math.MinInt64} {
		l, r, err := e.db.Claim(bg, k, []byte("fp"), receipts.LeaseFor(d))
		require.ErrorIs(t, err, receipts.ErrInvalidOptions, "Claim LeaseFor(%s)", d)
		require.ErrorIs(t, err, receipts.ErrInvalidArgument, "Claim LeaseFor(%s)", d)
		require.Nil(t, l)
		require.Nil(t, r)
		r, err = e.db.Do(bg, k, []byte("fp"), mustNotRun(t), receipts.LeaseFor(d))
		require.ErrorIs(t, err, receipts.ErrInvalidOptions, "Do LeaseFor(%s)", d)
		require.Nil(t, r)
		e.gone(k)
	}
	// The bounds are checked before anything else happens: a key held by
	// another caller makes no difference.
	held := e.claim(k, "fp")
	_, _, err := e.db.Claim(bg, k, []byte("fp"), receipts.LeaseFor(0))
	require.ErrorIs(t, err, receipts.ErrInvalidOptions)
	require.NoError(t, held.Release(bg))

	// Just inside the bounds.
	l := e.claim(k, "fp", receipts.LeaseFor(retention-1))
	require.Equal(t, retention-1, l.TTL())
	require.NoError(t, l.Release(bg))
	l = e.claim(k, "fp", receipts.LeaseFor(time.Millisecond))
	require.NoError(t, l.Release(bg))
	// The last LeaseFor wins.
	l = e.claim(k, "fp", receipts.LeaseFor(0), receipts.LeaseFor(time.Minute))
	require.Equal(t, time.Minute, l.TTL())
	require.NoError(t, l.Release(bg))
}

// Do with LeaseFor runs fn under a lease of that length: a claimer that
// comes after the store's LeaseTTL has passed finds it in progress.
func testLeaseForDo(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const long = 10 * time.Minute
	k := key("a", "export")
	r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		require.Equal(t, long, l.TTL())
		cur := e.lookup(k)
		require.True(t, cur.LeaseExpiresAt.Equal(e.clock.Now().Add(long)), "LeaseExpiresAt %s", cur.LeaseExpiresAt)
		e.clock.Advance(2 * leaseTTL)
		_, _, err := e.db.Claim(bg, k, []byte("fp"))
		require.ErrorIs(t, err, receipts.ErrInProgress, "the lease is live for 10m")
		return []byte("exported"), nil
	}, receipts.LeaseFor(long))
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Attempts)

	// Do with WaitAtMost gives up on a holder after that long.
	k2 := key("a", "held")
	held := e.claim(k2, "fp")
	_, err = e.db.Do(bg, k2, []byte("fp"), mustNotRun(t), receipts.WaitAtMost(0))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.False(t, errors.Is(err, context.DeadlineExceeded))
	require.NoError(t, held.Release(bg))
}

// Do renews a LeaseFor lease every third of its own length, by its own
// length. The store's LeaseTTL is 30s (a renewal every 10s); the claim's
// lease is 30ms, so renewals come every 10ms and set LeaseExpiresAt to
// now + 30ms. (Renewal runs on the wall clock.)
func testLeaseForDoRenews(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const short = 30 * time.Millisecond
	k := key("a", "k")
	r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		first := e.lookup(k)
		now := e.clock.Advance(time.Second) // far past the first lease
		deadline := time.Now().Add(5 * time.Second)
		for {
			cur := e.lookup(k)
			if cur.LeaseExpiresAt.After(first.LeaseExpiresAt) {
				require.True(t, cur.LeaseExpiresAt.Equal(now.Add(short)),
					"renewed to %s, want now + %s", cur.LeaseExpiresAt, short)
				break
			}
			require.True(t, time.Now().Before(deadline), "lease never renewed every third of its own length")
			time.Sleep(time.Millisecond)
		}
		_, _, err := e.db.Claim(bg, k, []byte("fp"))
		require.ErrorIs(t, err, receipts.ErrInProgress, "a renewed lease is live")
		return []byte("ok"), nil
	}, receipts.LeaseFor(short))
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Attempts)
}

// The RetryAfter of a claim held under LeaseFor follows its lease: with
// nothing measured it is the lease's remaining time (longer than the
// store's LeaseTTL), and once attempts are measured it counts a takeover's
// time from the takeover, not from its lease's end less Options.LeaseTTL.
func testLeaseForRetryAfter(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const long = 10 * time.Minute
	k := key("a", "k")
	l := e.claim(k, "fp", receipts.LeaseFor(long))
	e.clock.Advance(time.Minute)
	ip := e.inProgressFor(k, "fp")
	require.Equal(t, long-time.Minute, ip.RetryAfter, "nothing measured yet: the lease's remaining time")
	require.NoError(t, l.Release(bg))

	// A fresh store whose attempts take 100ms each, by its clock.
	e = newEnv(t, s, nil)
	const took = 100 * time.Millisecond
	for range 5 {
		// Bounded in real time: the store's clock is the kit's, so a Do that waited for a
		// lease (a store that did not release it) would wait for good.
		ctx, cancel := context.WithTimeout(bg, 30*time.Second)
		_, err := e.db.Do(ctx, key("a", "measured"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			e.clock.Advance(took)
			return nil, receipts.NotPerformed(errors.New("measured"))
		})
		cancel()
		require.ErrorContains(t, err, "measured", "each attempt runs and is not performed")
	}
	// A claim left to run out (not settled: not measured), then taken
	// over under LeaseFor(10m); the takeover has run 30ms: 70ms are left.
	e.claim(k, "fp", receipts.LeaseFor(time.Second))
	e.clock.Advance(time.Second)
	l = e.claim(k, "fp", receipts.LeaseFor(long))
	require.True(t, l.Recovered())
	e.clock.Advance(30 * time.Millisecond)
	ip = e.inProgressFor(k, "fp")
	require.InDelta(t, float64(took-30*time.Millisecond), float64(ip.RetryAfter), float64(time.Millisecond),
		"RetryAfter %s: a typical attempt takes 100ms, this one has run 30ms", ip.RetryAfter)
	require.NoError(t, l.Release(bg))
}
