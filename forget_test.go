package receipts_test

import (
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// TestForgetClearsRecovered: Forget, after reconciling, deletes a Recovered
// claim: the next claim starts afresh. It is fenced like Release.
func TestForgetClearsRecovered(t *testing.T) {
	s := newTestStore(t, nil)
	k, fp := key("pay", "1"), []byte("fp")
	l1, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.NoError(t, l1.Abandon(bg))
	l2, _, err := s.db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.True(t, l2.Recovered())

	require.ErrorIs(t, l1.Forget(bg), receipts.ErrLeaseLost)
	require.NoError(t, l2.Forget(bg))
	_, err = s.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound)
	s.reopen()
	l3, _, err := s.db.Claim(bg, k, []byte("another intent"))
	require.NoError(t, err)
	require.False(t, l3.Recovered())
	require.Equal(t, uint32(1), l3.Attempt())
	require.ErrorIs(t, l2.Forget(bg), receipts.ErrClosed)
}
