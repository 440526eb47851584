package receiptstest

// Behaviours being changed right now (issue 12, "Hardening: the promises
// that do not hold today"). The tests below check the contract as the issue
// states it. A test that fails on the code this kit was written against
// starts with t.Skip("pending issue 12 item N"): remove that line once the
// fix is merged.
//
//   - Item 3, options that cannot work are refused: a duration option whose
//     arithmetic would overflow (a Retention near math.MaxInt64) is either
//     refused with ErrInvalidOptions or works (today every record is
//     expired the moment it is written).          Issue12/Item3/...
//   - Item 4, WaitAtMost(d) with d <= 0 looks once and answers (today it
//     waits without any bound).                      Issue12/Item4/...
//   - Item 5, Close hands out no new lease: a waiter woken while Close runs
//     gets ErrClosed, not a lease. CloseHandsOutNoNewLease orders the
//     events; CloseRaceHandsOutNoNewLease races them (it caught the bug
//     most runs before the fix: engines now ask driver.Config.Closing
//     after the claim's time is taken, before the claim is written).
//                                                    Issue12/Item5/...
//   - Item 6, an unknown outcome is never forgotten: releasing a Recovered
//     lease (Release, or NotPerformed from Do's fn) keeps the next attempt
//     Recovered (today the record is deleted and the next attempt is
//     Attempt 1, not Recovered).                     Issue12/Item6/...
//   - Item 7, a result too large to store, returned by Do's fn after the
//     effect ran, is an outcome-unknown error that names the key (by its
//     keyed hash, DB.KeyName) and does
//     not match ErrInvalidArgument (today: ErrResultTooLarge).
//     Do/OversizedResultAbandons checks only what stays (the claim is
//     abandoned).                                    Issue12/Item7/...
//   - Item 10, InProgressError.RetryAfter is an estimate of when the answer
//     will be there, from the engine's recent operation durations, bounded
//     by the lease (today: the lease's remaining time, which renewal keeps
//     near LeaseTTL). Elsewhere the kit asserts only 0 < RetryAfter <=
//     the lease's remaining time.                    Issue12/Item10/...

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var issue12Tests = []test{
	{"Item3/HugeDurationsRefusedOrWorking", testHugeDurations},
	{"Item4/WaitAtMostNonPositiveLooksOnce", testWaitAtMostNonPositive},
	{"Item5/CloseHandsOutNoNewLease", testCloseHandsOutNoLease},
	{"Item5/CloseRaceHandsOutNoNewLease", testCloseRaceHandsOutNoLease},
	{"Item6/ReleaseOfRecoveredLeaseKeepsRecovered", testReleaseRecoveredKeepsRecovered},
	{"Item6/NotPerformedOnRecoveredLeaseKeepsRecovered", testNotPerformedRecoveredKeepsRecovered},
	{"Item7/OversizedResultIsOutcomeUnknown", testOversizedResultOutcomeUnknown},
	{"Item10/RetryAfterEstimatesTheAnswer", testRetryAfterEstimate},
}

// A Retention or LeaseTTL whose arithmetic would overflow is refused with
// ErrInvalidOptions, or it works: a receipt is replayed, not expired the
// moment it is written, and a lease stays live.
func testHugeDurations(t *testing.T, s Store) {
	for _, o := range []struct{ retention, ttl time.Duration }{
		{math.MaxInt64, 0},
		{math.MaxInt64, math.MaxInt64 - 1},
		{250 * 365 * 24 * time.Hour, 0}, // past about 236 years
	} {
		t.Run(fmt.Sprintf("retention=%d,ttl=%d", o.retention, o.ttl), func(t *testing.T) {
			clock := NewClock(time.Time{})
			db, err := s.Open(t, receipts.Options{Retention: o.retention, LeaseTTL: o.ttl, GCInterval: -1, Now: clock.Now})
			if err != nil {
				require.ErrorIs(t, err, receipts.ErrInvalidOptions)
				return
			}
			defer db.Close()
			k := key("a", "k")
			l, _, err := db.Claim(bg, k, []byte("fp"))
			require.NoError(t, err)
			_, _, err = db.Claim(bg, k, []byte("fp"))
			require.ErrorIs(t, err, receipts.ErrInProgress, "the lease is live")
			r, err := l.Commit(bg, []byte("done"))
			require.NoError(t, err)
			require.True(t, r.ExpiresAt.After(r.UpdatedAt), "ExpiresAt %s, UpdatedAt %s", r.ExpiresAt, r.UpdatedAt)
			clock.Advance(24 * time.Hour)
			_, got, err := db.Claim(bg, k, []byte("fp"))
			require.NoError(t, err)
			require.NotNil(t, got, "the receipt expired at once")
			require.Equal(t, []byte("done"), got.Result)
		})
	}
}

// WaitAtMost(d) with d <= 0 looks once and answers: in progress at once
// (not the context's error), a lease for a free key, the receipt for a
// finished one.
func testWaitAtMostNonPositive(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "held")
	l := e.claim(k, "fp")
	for _, d := range []time.Duration{0, -1, -time.Hour} {
		ctx, cancel := context.WithTimeout(bg, 2*time.Second) // bounds today's hang
		start := time.Now()
		_, _, err := e.db.Claim(ctx, k, []byte("fp"), receipts.WaitAtMost(d))
		cancel()
		require.Less(t, time.Since(start), time.Second, "WaitAtMost(%s) waited", d)
		var ip *receipts.InProgressError
		require.ErrorAs(t, err, &ip, "WaitAtMost(%s)", d)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "WaitAtMost(%s)", d)
		require.Positive(t, ip.RetryAfter)
	}
	free := e.claim(key("a", "free"), "fp", receipts.WaitAtMost(0))
	require.Equal(t, uint32(1), free.Attempt())
	got, err := l.Commit(bg, []byte("done"))
	require.NoError(t, err)
	sameReceipt(t, got, e.replay(k, "fp", receipts.WaitAtMost(0)))
}

// Close hands out no new lease: once Close has begun (held open by an
// in-flight Do), a waiter woken by that Do releasing its key gets
// ErrClosed, not a lease, and the key is free after a restart.
//
// This orders the events deterministically, and passes today. The race the
// issue describes (a waiter that is between two waits when Close begins
// claims without looking at Close) is testCloseRaceHandsOutNoLease.
func testCloseHandsOutNoLease(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	started, finish := make(chan struct{}), make(chan struct{})
	doDone := make(chan error, 1)
	go func() {
		_, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			close(started)
			<-finish
			return nil, receipts.NotPerformed(errors.New("nothing happened"))
		})
		doDone <- err
	}()
	recv(t, started, "fn to start")
	const n = 4
	out := make(chan result, n)
	for range n {
		e.claimAsync(bg, k, "fp", out, receipts.WaitForResult())
	}
	letWaitersWait()
	closed := make(chan error, 1)
	go func() { closed <- e.db.Close() }()
	// Close has begun once new calls are refused.
	require.Eventually(t, func() bool {
		_, err := e.db.Lookup(bg, key("a", "probe"))
		return errors.Is(err, receipts.ErrClosed)
	}, 10*time.Second, time.Millisecond)
	close(finish)
	for range n {
		o := recv(t, out, "a waiter")
		require.ErrorIs(t, o.err, receipts.ErrClosed, "a lease handed out during Close: %+v", o)
		require.Nil(t, o.l)
	}
	require.Error(t, recv(t, doDone, "Do"))
	require.NoError(t, recv(t, closed, "Close"))
	e.reopen()
	e.gone(k)
	l := e.claim(k, "fp")
	require.False(t, l.Recovered(), "no claim was left behind by a lease handed out during Close")
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

// The same through Do: NotPerformed from a Recovered attempt's fn keeps the
// next attempt Recovered.
func testNotPerformedRecoveredKeepsRecovered(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	_, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, errors.New("provider timed out")
	})
	require.Error(t, err)
	var recovered []bool
	fn := func(_ context.Context, l *receipts.Lease) ([]byte, error) {
		recovered = append(recovered, l.Recovered())
		return nil, receipts.NotPerformed(errors.New("provider says: not yet"))
	}
	for range 3 {
		_, err = e.db.Do(bg, k, []byte("fp"), fn)
		require.Error(t, err)
	}
	require.Equal(t, []bool{true, true, true}, recovered)
}

// A result too large to store, returned after the effect ran: an
// outcome-unknown error that names the key and is not bad input; the claim
// is abandoned.
func testOversizedResultOutcomeUnknown(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("tenant-7", "op-oversized")
	r, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return make([]byte, receipts.MaxResultSize+1), nil
	})
	require.Error(t, err)
	require.Nil(t, r)
	require.NotErrorIs(t, err, receipts.ErrInvalidArgument, "the effect ran: this is not bad input")
	require.NotErrorIs(t, err, receipts.ErrResultTooLarge)
	require.Contains(t, err.Error(), e.db.KeyName(k), "the error names the key, by its keyed hash")
	require.False(t, strings.Contains(err.Error(), k.Scope) || strings.Contains(err.Error(), k.ID),
		"and never by its raw scope or ID (Options.LogKeys is off): %v", err)
	require.True(t, e.lookup(k).Abandoned(e.clock.Now()))
	require.True(t, e.claim(k, "fp").Recovered())
}

// RetryAfter estimates when the answer will be there: after operations that
// take about 100ms, a retry of one just started is told well under the
// lease (today it is told the lease's remaining time, 30s).
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

// While Close is beginning, holders release keys that waiters wait for. A
// waiter that decides its claim after Close began must get ErrClosed. The
// kit cannot see inside Close, so it uses the store's clock as a witness:
// once new calls are refused (Close has begun) it moves the clock a second
// ahead; a claim record written at that later time, found after a restart,
// was handed out during Close. A claim decided before the jump carries an
// earlier time.
//
// It is probabilistic: on the code it was written against it caught the
// race in about 4 runs of 5 (30 trials each). A fix that refuses a claim
// once Close has begun, checked under the key lock after the claim's time
// is read, passes it every time.
func testCloseRaceHandsOutNoLease(t *testing.T, s Store) {
	const trials, keys = 30, 32
	caught := 0
	for trial := range trials {
		e := newEnv(t, s, nil)
		inflight := key("a", "inflight")
		started, finish := make(chan struct{}), make(chan struct{})
		doDone := make(chan error, 1)
		go func() {
			_, err := e.db.Do(bg, inflight, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
				close(started)
				<-finish
				return []byte("x"), nil
			})
			doDone <- err
		}()
		recv(t, started, "fn to start")
		var holders []*receipts.Lease
		for i := range keys {
			holders = append(holders, e.claim(key("b", fmt.Sprint(i)), "fp"))
		}
		var wg sync.WaitGroup
		for i := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, _ = e.db.Claim(bg, key("b", fmt.Sprint(i)), []byte("fp"), receipts.WaitForResult())
			}()
		}
		letWaitersWait()
		go func() {
			for _, h := range holders {
				_ = h.Release(bg)
			}
		}()
		closed := make(chan error, 1)
		time.Sleep(time.Duration(trial%8) * 20 * time.Microsecond) // vary the overlap
		go func() { closed <- e.db.Close() }()
		for { // until Close has begun
			_, err := e.db.Lookup(bg, key("a", "probe"))
			if errors.Is(err, receipts.ErrClosed) {
				break
			}
		}
		jump := e.clock.Advance(time.Second)
		close(finish)
		require.NoError(t, recv(t, doDone, "Do"))
		require.NoError(t, recv(t, closed, "Close"))
		wg.Wait()
		e.reopen()
		for r, err := range e.db.Scan(bg, receipts.Filter{Scope: "b"}) {
			require.NoError(t, err)
			if !r.UpdatedAt.Before(jump) {
				caught++
				t.Logf("trial %d: %s claimed at %s, after Close began", trial, r.Key, r.UpdatedAt)
			}
		}
	}
	require.Zero(t, caught, "leases handed out during Close")
}
