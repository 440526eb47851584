package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// TestPanickingStagedEffectAbandons (issue 43, item 2): a staged effect that panics (in the
// commit, after fn returned) abandons the claim at once, as a panic in fn does: the next
// attempt takes the key over, Recovered, instead of getting ErrInProgress for a whole lease
// (an hour here). The panic reaches the caller, and the effect's write is not applied.
func TestPanickingStagedEffectAbandons(t *testing.T) {
	s := newTestStore(t, func(o *pebblestore.Options) { o.LeaseTTL, o.Retention = time.Hour, 24*time.Hour })
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
	_, closer, err := pebblestore.DB(s.db).Get([]byte("app/paid"))
	require.ErrorIs(t, err, pebble.ErrNotFound, "the panicking effect's write")
	if closer != nil {
		_ = closer.Close()
	}
	rec, err := l.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, rec.State)
}

// TestEffectThatCommitsItself (issue 43, item 2): on Pebble, a staged effect that commits
// the batch itself (b.Commit) has made its writes durable, so "nothing is written" cannot
// hold: the commit fails with an error that says so (driver.ErrEffectEnded, ErrOutcomeUnknown), no
// receipt is recorded, and the claim is abandoned at once (the next attempt is Recovered).
// Before, the effect's error came back with the lease still held (to be released, as if
// nothing had happened), and an effect that returned nil made Pebble panic ("batch already
// applied").
func TestEffectThatCommitsItself(t *testing.T) {
	s := newTestStore(t, func(o *pebblestore.Options) { o.LeaseTTL, o.Retention = time.Hour, 24*time.Hour })
	committing := func(id string, fail bool) receipts.Effect {
		return receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error {
			if err := b.Set([]byte("app/"+id), []byte("paid"), nil); err != nil {
				return err
			}
			if err := b.Commit(pebble.Sync); err != nil {
				return err
			}
			if fail {
				return errors.New("the provider said no")
			}
			return nil
		})
	}
	check := func(t *testing.T, k receipts.Key, err error) {
		t.Helper()
		require.ErrorIs(t, err, driver.ErrEffectEnded)
		require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
		require.Contains(t, err.Error(), "committed the batch")
		require.NotContains(t, err.Error(), "%!")
		v, closer, gerr := pebblestore.DB(s.db).Get([]byte("app/" + k.ID))
		require.NoError(t, gerr, "the effect's write is durable: the error must not say nothing was written")
		require.Equal(t, "paid", string(v))
		_ = closer.Close()
		l, r, err := s.db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err, "the next attempt, at once")
		require.Nil(t, r)
		require.True(t, l.Recovered())
		require.NoError(t, l.Abandon(bg))
	}
	for _, fail := range []bool{true, false} {
		t.Run(fmt.Sprintf("Commit/fails=%v", fail), func(t *testing.T) {
			k := key("s", fmt.Sprintf("commit-%v", fail))
			l, _, err := s.db.Claim(bg, k, []byte("fp"))
			require.NoError(t, err)
			l.Stage(committing(k.ID, fail))
			var r *receipts.Receipt
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				r, err = l.Commit(bg, []byte("ok"))
			}()
			require.Nil(t, r)
			rerr := l.Release(bg) // the claim stays abandoned: releasing it could run the effect twice
			require.ErrorIs(t, rerr, driver.ErrEffectEnded)
			require.ErrorIs(t, rerr, receipts.ErrOutcomeUnknown)
			check(t, k, err)
		})
		t.Run(fmt.Sprintf("Do/fails=%v", fail), func(t *testing.T) {
			k := key("s", fmt.Sprintf("do-%v", fail))
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				_, err = s.db.Do(bg, k, []byte("fp"), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
					l.Stage(committing(k.ID, fail))
					return []byte("ok"), nil
				})
			}()
			check(t, k, err)
		})
	}
}
