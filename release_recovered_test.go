package receipts_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// TestReleaseRecoveredStaysRecovered: releasing a Recovered lease, directly
// or through NotPerformed from Do's fn, keeps the claim abandoned (the first
// attempt's outcome is still unknown), across a restart: the next attempt is
// Recovered with one more Attempt. Before, the record was deleted and the
// next attempt got Attempt 1, Recovered() == false.
func TestReleaseRecoveredStaysRecovered(t *testing.T) {
	s := newTestStore(t, nil)
	k, fp := key("pay", "1"), []byte("fp")
	l1, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.NoError(t, l1.Abandon(bg)) // attempt 1: outcome unknown

	l2, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.True(t, l2.Recovered())
	require.NoError(t, l2.Release(bg))

	r, err := s.db.Lookup(bg, k)
	require.NoError(t, err, "the released Recovered claim was deleted")
	require.Equal(t, receipts.Pending, r.State)
	require.Equal(t, uint32(2), r.Attempts)
	require.Equal(t, fp, r.Fingerprint)
	require.True(t, r.Abandoned(s.clock.Now()))

	s.reopen() // the kept claim is synced
	l3, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.True(t, l3.Recovered(), "the next attempt after releasing a Recovered lease")
	require.Equal(t, uint32(3), l3.Attempt())
	require.NoError(t, l3.Release(bg))

	// Do's NotPerformed releases the same way.
	var seen []bool
	_, err = s.db.Do(bg, k, fp, func(_ context.Context, l *receipts.Lease) ([]byte, error) {
		seen = append(seen, l.Recovered())
		return nil, receipts.NotPerformed(errors.New("provider says: no such charge"))
	})
	require.Error(t, err)
	r, err = s.db.Do(bg, k, fp, func(_ context.Context, l *receipts.Lease) ([]byte, error) {
		seen = append(seen, l.Recovered())
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, seen)
	require.Equal(t, uint32(5), r.Attempts)
}

// TestReleaseFirstAttemptStartsAfresh: a first attempt's Release still
// deletes the record (nothing is unknown).
func TestReleaseFirstAttemptStartsAfresh(t *testing.T) {
	s := newTestStore(t, nil)
	k, fp := key("pay", "2"), []byte("fp")
	l, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.NoError(t, l.Release(bg))
	_, err = s.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound)
	s.clock.Advance(time.Second)
	l, _, err = s.db.Claim(bg, k, []byte("other"))
	require.NoError(t, err)
	require.False(t, l.Recovered())
	require.Equal(t, uint32(1), l.Attempt())
}
