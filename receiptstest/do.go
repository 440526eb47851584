package receiptstest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var doTests = []test{
	{"Success", testDoSuccess},
	{"NotPerformedReleases", testDoNotPerformed},
	{"PermanentIsStoredAsFailed", testDoPermanent},
	{"UnknownOutcomeAbandons", testDoUnknown},
	{"PanicAbandonsAndRepanics", testDoPanic},
	{"OversizedResultAbandons", testDoOversized},
	{"RecordsAfterTheCallerGoesAway", testDoDetached},
	{"RenewsTheLeaseInTheBackground", testDoRenews},
	{"LeaseLostCancelsFn", testDoLeaseLost},
	{"NotPerformedOnRecoveredLeaseKeepsRecovered", testNotPerformedRecoveredKeepsRecovered},
}

// fn's nil error: a Succeeded receipt, fn run once with a first lease.
func testDoSuccess(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "ok")
	calls := 0
	r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		calls++
		require.Equal(t, k, l.Key())
		require.Equal(t, uint32(1), l.Attempt())
		require.False(t, l.Recovered())
		require.NoError(t, ctx.Err())
		// While fn runs, the claim is visible and its lease live.
		require.Equal(t, receipts.Pending, e.lookup(k).State)
		e.inProgress(k, "fp")
		return []byte("result"), nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	require.Equal(t, receipts.Succeeded, r.State)
	require.Equal(t, []byte("result"), r.Result)
	require.Equal(t, uint32(1), r.Attempts)
	sameReceipt(t, r, e.lookup(k))
}

// NotPerformed: the claim is released, Do's error wraps fn's, and the key
// starts afresh.
func testDoNotPerformed(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "np")
	cause := errors.New("validation failed before any effect")
	r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return []byte("ignored"), receipts.NotPerformed(cause)
	})
	require.Nil(t, r)
	require.ErrorIs(t, err, cause)
	e.gone(k)
	l := e.claim(k, "other intent")
	require.False(t, l.Recovered())
	require.Equal(t, uint32(1), l.Attempt())
	require.NoError(t, l.Release(bg))
}

// Permanent: a Failed receipt with fn's bytes (or the error's text),
// returned with ErrFailed and the cause, and replayed with ErrFailed.
func testDoPermanent(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "perm")
	cause := errors.New("card declined")
	r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return []byte(`{"error":"declined"}`), receipts.Permanent(cause)
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.ErrorIs(t, err, cause)
	require.Equal(t, receipts.Failed, r.State)
	require.Equal(t, []byte(`{"error":"declined"}`), r.Result)

	r2, err := e.db.Do(bg, k, []byte("fp"), nil)
	require.ErrorIs(t, err, receipts.ErrFailed)
	sameReceipt(t, r, r2)
	sameReceipt(t, r, e.replay(k, "fp"))

	// No bytes from fn: the error's text is the result.
	k2 := key("a", "perm-text")
	r, err = e.db.Do(bg, k2, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return nil, receipts.Permanent(cause)
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, receipts.Failed, r.State)
	require.Contains(t, string(r.Result), cause.Error())
}

// Any other error: the outcome is unknown, the claim is abandoned at once,
// and the next attempt is Recovered (Attempt 2).
func testDoUnknown(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "unknown")
	cause := errors.New("provider timed out")
	var first *receipts.Lease
	r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		first = l
		return []byte("partial"), cause
	})
	require.Nil(t, r)
	require.ErrorIs(t, err, cause)
	got := e.visible(k, receipts.Pending)
	require.True(t, got.Abandoned(e.clock.Now()), "abandoned at once, no waiting for the lease")
	require.Nil(t, got.Result)
	e.wantCounts(counts{Pending: 1, Abandoned: 1})

	var recovered bool
	var attempt uint32
	var pk string
	r, err = e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		recovered, attempt, pk = l.Recovered(), l.Attempt(), l.ProviderKey()
		return []byte("reconciled"), nil
	})
	require.NoError(t, err)
	require.True(t, recovered)
	require.Equal(t, uint32(2), attempt)
	require.Equal(t, first.ProviderKey(), pk)
	require.Equal(t, []byte("reconciled"), r.Result)
	require.Equal(t, uint32(2), r.Attempts)
}

// A panic in fn abandons the claim and is re-raised.
func testDoPanic(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "panic")
	require.PanicsWithValue(t, "boom", func() {
		_, _ = e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			panic("boom")
		})
	})
	require.True(t, e.lookup(k).Abandoned(e.clock.Now()))
	var recovered bool
	_, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		recovered = l.Recovered()
		return []byte("x"), nil
	})
	require.NoError(t, err)
	require.True(t, recovered)
}

// A result too large to store, returned after the effect ran: the outcome
// is unknown, so the claim is abandoned, and the error says so: it names
// the key (by its keyed hash, DB.KeyName, never its raw scope or ID) and
// does not match ErrInvalidArgument or ErrResultTooLarge (this is not bad
// input: the effect ran).
func testDoOversized(t *testing.T, s Store) {
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
	got := e.lookup(k)
	require.Equal(t, receipts.Pending, got.State)
	require.True(t, got.Abandoned(e.clock.Now()), "the effect may have happened: reconcile")
	require.True(t, e.claim(k, "fp").Recovered())
}

// Once fn has returned, the outcome is recorded even if the caller's
// context has ended.
func testDoDetached(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	for _, tc := range []struct {
		name  string
		fnErr error
		state receipts.State
	}{
		{"commit", nil, receipts.Succeeded},
		{"fail", receipts.Permanent(errors.New("declined")), receipts.Failed},
		{"abandon", errors.New("unknown"), receipts.Pending},
	} {
		k := key("a", tc.name)
		ctx, cancel := context.WithCancel(bg)
		_, err := e.db.Do(ctx, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			cancel() // the client disconnects right after the effect
			return []byte("effect done"), tc.fnErr
		})
		require.NotErrorIs(t, err, context.Canceled, tc.name)
		got := e.lookup(k)
		require.Equal(t, tc.state, got.State, tc.name)
		if tc.state == receipts.Pending {
			require.True(t, got.Abandoned(e.clock.Now()), tc.name)
		} else {
			require.Equal(t, []byte("effect done"), got.Result, tc.name)
		}
	}
	k := key("a", "release")
	ctx, cancel := context.WithCancel(bg)
	_, err := e.db.Do(ctx, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		cancel()
		return nil, receipts.NotPerformed(errors.New("nothing"))
	})
	require.Error(t, err)
	e.gone(k)
}

// Do renews the lease while fn runs. (Renewal runs on the wall clock: the
// lease is 30ms.)
func testDoRenews(t *testing.T, s Store) {
	e := newEnv(t, s, func(o *receipts.Options) { o.LeaseTTL = 30 * time.Millisecond })
	k := key("a", "slow")
	r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		first := e.lookup(k)
		e.clock.Advance(time.Second) // far past the first lease
		deadline := time.Now().Add(10 * time.Second)
		for {
			cur := e.lookup(k)
			if cur.LeaseExpiresAt.After(first.LeaseExpiresAt) {
				break // renewed by Do's background renewer
			}
			require.True(t, time.Now().Before(deadline), "lease never renewed")
			time.Sleep(time.Millisecond)
		}
		_, _, err := e.db.Claim(bg, k, []byte("fp"))
		require.ErrorIs(t, err, receipts.ErrInProgress, "a renewed lease is live")
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Attempts)
}

// A takeover while fn runs cancels fn's context with ErrLeaseLost, and
// Do's error wraps ErrLeaseLost; the new holder's claim is untouched.
func testDoLeaseLost(t *testing.T, s Store) {
	e := newEnv(t, s, func(o *receipts.Options) { o.LeaseTTL = 30 * time.Millisecond })
	k := key("a", "k")
	var thief *receipts.Lease
	_, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		// Another caller takes over (renewals can't keep up with a clock
		// that jumps a minute; one may land between jump and claim).
		require.Eventually(t, func() bool {
			e.clock.Advance(time.Minute)
			var err error
			thief, _, err = e.db.Claim(bg, k, []byte("fp"))
			return err == nil && thief != nil
		}, 10*time.Second, time.Millisecond)
		require.True(t, thief.Recovered())
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("fn's context was not cancelled")
		}
		require.ErrorIs(t, context.Cause(ctx), receipts.ErrLeaseLost)
		return []byte("too late"), nil
	})
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	got := e.lookup(k)
	require.Equal(t, receipts.Pending, got.State, "the stale result is not recorded")
	require.Equal(t, thief.Token(), got.Token)
	r, err := thief.Commit(bg, []byte("thief"))
	require.NoError(t, err)
	require.Equal(t, []byte("thief"), r.Result)
}

// NotPerformed from a Recovered attempt's fn keeps the
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
