package receipts_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// TestOversizedResultIsOutcomeUnknown: a result too large to store,
// returned after the effect ran, is not bad input. Do, Run and RunBatch
// abandon the claim and return an error that names the key and wraps
// ErrOutcomeUnknown, not ErrInvalidArgument (which a service maps to 400);
// a direct Commit of the same result changes nothing and is bad input.
func TestOversizedResultIsOutcomeUnknown(t *testing.T) {
	s := newTestStore(t, nil)
	fp := []byte("fp")
	big := make([]byte, receipts.MaxResultSize+1)
	wantUnknown := func(t *testing.T, k receipts.Key, err error) {
		t.Helper()
		require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
		require.NotErrorIs(t, err, receipts.ErrInvalidArgument, "the effect ran: not bad input")
		require.NotErrorIs(t, err, receipts.ErrResultTooLarge)
		require.Contains(t, err.Error(), s.db.KeyName(k), "the error names the key, by its keyed hash")
		require.NotContains(t, err.Error(), k.String(), "and never by its raw scope and ID (Options.LogKeys is off)")
		got, err := s.db.Lookup(bg, k)
		require.NoError(t, err)
		require.Equal(t, receipts.Pending, got.State)
		require.True(t, got.Abandoned(s.clock.Now()), "abandoned at once: the next attempt reconciles")
		var recovered bool
		_, err = s.db.Do(bg, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			recovered = l.Recovered()
			return []byte("ok"), nil
		})
		require.NoError(t, err)
		require.True(t, recovered, "the next attempt takes over at once, Recovered")
	}

	t.Run("Do", func(t *testing.T) {
		k := key("a", "do")
		_, err := s.db.Do(bg, k, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return big, nil })
		wantUnknown(t, k, err)
	})
	t.Run("Do Permanent", func(t *testing.T) {
		k := key("a", "perm")
		_, err := s.db.Do(bg, k, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			return big, receipts.Permanent(errors.New("declined"))
		})
		wantUnknown(t, k, err)
		require.NotErrorIs(t, err, receipts.ErrFailed, "no Failed receipt was stored")
	})
	t.Run("Run", func(t *testing.T) {
		k := key("a", "run")
		l, _, err := s.db.Claim(bg, k, fp)
		require.NoError(t, err)
		_, err = l.Run(bg, func(context.Context, *receipts.Lease) ([]byte, error) { return big, nil })
		wantUnknown(t, k, err)
	})
	t.Run("Commit", func(t *testing.T) {
		k := key("a", "commit")
		l, _, err := s.db.Claim(bg, k, fp)
		require.NoError(t, err)
		_, err = l.Commit(bg, big)
		require.ErrorIs(t, err, receipts.ErrResultTooLarge)
		require.ErrorIs(t, err, receipts.ErrInvalidArgument)
		require.NotErrorIs(t, err, receipts.ErrOutcomeUnknown)
		got, err := s.db.Lookup(bg, k)
		require.NoError(t, err)
		require.Equal(t, receipts.Pending, got.State)
		require.False(t, got.Abandoned(s.clock.Now()), "an oversized Commit changes nothing: the lease is still held")
		_, err = l.Commit(bg, []byte("fits"))
		require.NoError(t, err)
	})
	t.Run("unknown error", func(t *testing.T) {
		k := key("a", "unknown")
		cause := errors.New("connection reset")
		_, err := s.db.Do(bg, k, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return nil, cause })
		require.ErrorIs(t, err, cause)
		wantUnknown(t, k, err)
		require.True(t, strings.HasPrefix(err.Error(), "receipts: outcome unknown: "), err.Error())
	})
}
