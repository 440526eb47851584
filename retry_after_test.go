package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// TestRetryAfterEstimatesCompletion: once a few operations have taken
// 100ms each (by the injected clock), a conflict with an operation in
// progress says to retry in about what is left of a typical operation, not
// after the lease's remaining time (which renewal keeps near LeaseTTL).
func TestRetryAfterEstimatesCompletion(t *testing.T) {
	s := newTestStore(t, nil) // LeaseTTL 30s
	fp := []byte("fp")
	const took = 100 * time.Millisecond
	for i := range 5 {
		_, err := s.db.Do(bg, key("a", fmt.Sprint("op", i)), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			s.clock.Advance(took)
			return []byte("ok"), nil
		})
		require.NoError(t, err)
	}

	inProgress := func(k receipts.Key) time.Duration {
		t.Helper()
		_, _, err := s.db.Claim(bg, k, fp)
		var ip *receipts.InProgressError
		require.ErrorAs(t, err, &ip)
		got, err := s.db.Lookup(bg, k)
		require.NoError(t, err)
		left := got.LeaseExpiresAt.Sub(s.clock.Now())
		require.LessOrEqual(t, ip.RetryAfter, left, "never past the holder's lease")
		require.GreaterOrEqual(t, ip.RetryAfter, time.Millisecond)
		return ip.RetryAfter
	}

	// A first attempt that has run 30ms: about 70ms are left.
	k := key("a", "slow")
	l, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	s.clock.Advance(30 * time.Millisecond)
	ra := inProgress(k)
	require.InDelta(t, float64(70*time.Millisecond), float64(ra), float64(5*time.Millisecond), "RetryAfter %s", ra)

	// Past the typical duration: another typical duration, still far below
	// the lease's remaining time.
	s.clock.Advance(200 * time.Millisecond)
	ra = inProgress(k)
	require.InDelta(t, float64(took), float64(ra), float64(5*time.Millisecond), "RetryAfter %s", ra)
	require.NoError(t, l.Abandon(bg))

	// A takeover attempt (Attempt 2) that has just started: a typical
	// duration is left.
	l, _, err = s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.True(t, l.Recovered())
	ra = inProgress(k)
	require.Less(t, ra, time.Second, "RetryAfter %s", ra)
	_, err = l.Commit(bg, []byte("done"))
	require.NoError(t, err)

	// The lease bounds the estimate: a holder whose lease is about to end.
	k = key("a", "ending")
	l, _, err = s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	s.clock.Advance(30*time.Second - 2*time.Millisecond)
	ra = inProgress(k)
	require.Equal(t, 2*time.Millisecond, ra)
	require.NoError(t, l.Release(bg))
}

// TestRetryAfterBeforeAnyMeasurement: with no operation measured yet, the
// estimate is the lease's remaining time, as before.
func TestRetryAfterBeforeAnyMeasurement(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "first")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	_, _, err = s.db.Claim(bg, k, []byte("fp"))
	var ip *receipts.InProgressError
	require.True(t, errors.As(err, &ip), "%v", err)
	require.Equal(t, 30*time.Second, ip.RetryAfter)
	require.NoError(t, l.Release(bg))
}
