package receipts_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// TestPanickingStagedEffectAbandons (issue 43, item 2): a staged effect that panics (in the
// commit, after fn returned) abandons the claim at once, as a panic in fn does: the next
// attempt takes the key over, Recovered, instead of getting ErrInProgress for a whole lease
// (an hour here). The panic reaches the caller, and the effect's write is not applied.
func TestPanickingStagedEffectAbandons(t *testing.T) {
	s := newTestStore(t, func(o *receipts.Options) { o.LeaseTTL, o.Retention = time.Hour, 24*time.Hour })
	k := key("s", "pay")
	var got any
	func() {
		defer func() { got = recover() }()
		_, _ = s.db.Do(bg, k, []byte("fp"), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
			l.Stage(receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error {
				if err := b.Set([]byte("app/paid"), []byte("yes"), nil); err != nil {
					return err
				}
				panic("effect exploded")
			}))
			return []byte("ok"), nil
		})
	}()
	require.Equal(t, "effect exploded", got, "the effect's panic reaches the caller")

	l, r, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err, "the next attempt, at once")
	require.Nil(t, r)
	require.True(t, l.Recovered(), "the next attempt is Recovered")
	_, closer, err := s.db.Pebble().Get([]byte("app/paid"))
	require.ErrorIs(t, err, pebble.ErrNotFound, "the panicking effect's write")
	if closer != nil {
		_ = closer.Close()
	}
	rec, err := l.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, rec.State)
}
