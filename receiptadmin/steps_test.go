package receiptadmin_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

// The get endpoint answers a key's step journal with the record: each step's position,
// name, state, fingerprint, result, time and provider key, the uncertain one marked (the
// pending step of an abandoned claim); a live claim's pending step is not uncertain, and
// a key without steps has none. The list endpoint carries no journals.
func TestHandlerSteps(t *testing.T) {
	onEngines(t, func(t *testing.T, open func(*testing.T, func(*receipts.Options)) *testStore) {
		s := open(t, nil)
		adminFixture(t, s)
		ctx := context.Background()
		k := key("acct_3", "trip")
		_, err := s.db.Do(ctx, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			if _, err := l.Step(ctx, "reserve", []byte("seat"), func(context.Context, *receipts.Step) ([]byte, error) {
				return []byte("12A"), nil
			}); err != nil {
				return nil, err
			}
			s.clock.Advance(time.Second)
			return l.Step(ctx, "charge", nil, func(context.Context, *receipts.Step) ([]byte, error) {
				return nil, errors.New("connection reset")
			})
		})
		require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
		h := receiptadmin.Handler(s.db)

		var r receiptadmin.Receipt
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?scope=acct_3&id=trip", &r))
		require.True(t, r.Abandoned)
		want, err := s.db.Steps(ctx, k)
		require.NoError(t, err)
		require.Equal(t, []receiptadmin.Step{
			{Index: 0, Name: "reserve", State: "succeeded", Fingerprint: "73656174", Result: []byte("12A"), At: want[0].At.UTC(), ProviderKey: want[0].ProviderKey},
			{Index: 1, Name: "charge", State: "pending", Uncertain: true, Fingerprint: "", At: want[1].At.UTC(), ProviderKey: want[1].ProviderKey},
		}, r.Steps)
		require.Equal(t, "charge", r.UncertainStep().Name)
		require.Regexp(t, `^rk_[A-Za-z0-9_-]{43}$`, r.Steps[1].ProviderKey)

		// A live claim: its pending step runs, it is not uncertain.
		l, _, err := s.db.Claim(ctx, key("acct_3", "live"), []byte("fp"))
		require.NoError(t, err)
		_, err = l.Step(ctx, "reserve", nil, func(context.Context, *receipts.Step) ([]byte, error) {
			var live receiptadmin.Receipt
			require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?scope=acct_3&id=live", &live))
			require.Len(t, live.Steps, 1)
			require.Equal(t, "pending", live.Steps[0].State)
			require.False(t, live.Steps[0].Uncertain)
			require.Nil(t, live.UncertainStep())
			return []byte("ok"), nil
		})
		require.NoError(t, err)

		var plain receiptadmin.Receipt
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?scope=acct_2&id=op-lost", &plain))
		require.Nil(t, plain.Steps)

		var list receiptadmin.List
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/list?scope=acct_3", &list))
		require.Len(t, list.Receipts, 2)
		for _, r := range list.Receipts {
			require.Nil(t, r.Steps)
		}
	})
}
