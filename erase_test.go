package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// fillScope records n receipts in scope (results naming them), and returns their keys.
func fillScope(t *testing.T, db *receipts.DB, scope string, n int) []receipts.Key {
	return fillScopeIDs(t, db, scope, "op-", n)
}

// fillScopeIDs is fillScope with IDs prefix0, prefix1, ...
func fillScopeIDs(t *testing.T, db *receipts.DB, scope, prefix string, n int) []receipts.Key {
	t.Helper()
	ks := make([]receipts.Key, n)
	for i := range n {
		ks[i] = key(scope, fmt.Sprint(prefix, i))
		_, err := db.Do(bg, ks[i], []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte("secret of " + scope + " " + ks[i].ID), nil
		})
		require.NoError(t, err)
	}
	return ks
}

// TestEraseScope: after EraseScope nothing of the scope is readable through any API, its
// keys are refused until the erasure's end (then new actions), other scopes are untouched,
// a second erasure changes nothing, and a Checkpoint taken before cannot decrypt the
// scope's results after.
func TestEraseScope(t *testing.T) {
	kr := newKeyring(t)
	s := newTestStore(t, func(o *pebblestore.Options) { o.Keyring = kr })
	db := s.db

	// Tombstones of the scope: receipts past retention.
	tombKeys := fillScopeIDs(t, db, "victim", "old-", 3)
	s.clock.Advance(2 * time.Hour)
	victim := fillScope(t, db, "victim", 30)
	other := fillScope(t, db, "other", 10)
	held, _, err := db.Claim(bg, key("victim", "held"), []byte("fp")) // a live lease
	require.NoError(t, err)
	abandoned, _, err := db.Claim(bg, key("victim", "abandoned"), []byte("fp"))
	require.NoError(t, err)
	require.NoError(t, abandoned.Abandon(bg))
	_, _, err = db.Claim(bg, tombKeys[0], []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrExpired) // a tombstone, before

	ckpt := "ckpt"
	require.NoError(t, pebblestore.Checkpoint(db, ckpt))

	st, err := db.EraseScope(bg, "victim")
	require.NoError(t, err)
	require.Equal(t, int64(35), st.Records) // 30 receipts, the held claim, the abandoned one, 3 past retention not reclaimed yet
	require.True(t, st.KeyDestroyed)
	require.Equal(t, db.ScopeID("victim"), st.ScopeID)
	require.Equal(t, s.clock.Now(), st.At)
	require.Equal(t, s.clock.Now().Add(time.Hour+db.Options().TombstoneWindow), st.Until)

	checkErased := func(db *receipts.DB) {
		t.Helper()
		for _, k := range append(append(victim, tombKeys...), key("victim", "held"), key("victim", "abandoned"), key("victim", "never-used")) {
			_, err := db.Lookup(bg, k)
			require.ErrorIs(t, err, receipts.ErrErased, k.ID)
			require.ErrorIs(t, err, receipts.ErrNotFound)
			var ee *receipts.ErasedError
			require.ErrorAs(t, err, &ee)
			require.Equal(t, st.Until, ee.Until)
			_, err = db.Inspect(bg, k)
			require.ErrorIs(t, err, receipts.ErrErased)
			ran := false
			_, err = db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
				ran = true
				return nil, nil
			})
			require.ErrorIs(t, err, receipts.ErrErased)
			require.ErrorIs(t, err, receipts.ErrExpired)
			require.False(t, ran)
			_, _, err = db.Claim(bg, k, []byte("another fp"))
			require.ErrorIs(t, err, receipts.ErrErased)
		}
		for r, err := range db.Scan(bg, receipts.Filter{}) {
			require.NoError(t, err)
			require.Equal(t, "other", r.Key.Scope)
		}
		for tb, err := range db.Tombstones(bg, "victim", 0) {
			require.NoError(t, err)
			t.Fatalf("a tombstone of the erased scope: %v", tb)
		}
		for _, k := range other {
			r, err := db.Lookup(bg, k)
			require.NoError(t, err)
			require.Equal(t, "secret of other "+k.ID, string(r.Result))
		}
		c := countOf(t, db)
		require.Equal(t, int64(10), c.Succeeded)
		require.Zero(t, c.Pending)
	}
	checkErased(db)
	_, err = held.Commit(bg, []byte("too late"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.ErrorIs(t, held.Renew(bg), receipts.ErrLeaseLost)

	again, err := db.EraseScope(bg, "victim")
	require.NoError(t, err)
	require.Equal(t, st, again)
	var ledger []receipts.EraseStats
	for e, err := range db.Erasures(bg) {
		require.NoError(t, err)
		ledger = append(ledger, e)
	}
	require.Equal(t, []receipts.EraseStats{st}, ledger)

	s.reopen()
	checkErased(s.db)
	rep, err := s.db.Check(bg)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)

	// The checkpoint from before still holds the scope's records, but not their results:
	// its wrapped data key no longer opens.
	cp, err := pebblestore.Open(ckpt, &pebblestore.Options{Options: receipts.Options{Keyring: kr, GCInterval: -1, Now: s.clock.Now}, Pebble: &pebble.Options{FS: s.fs}})
	require.NoError(t, err)
	_, err = cp.Lookup(bg, victim[0])
	require.ErrorIs(t, err, receipts.ErrErased)
	require.NotContains(t, fmt.Sprint(err), "secret")
	for _, err := range cp.Scan(bg, receipts.Filter{Scope: "victim", State: receipts.Succeeded}) {
		require.ErrorIs(t, err, receipts.ErrErased)
	}
	r, err := cp.Lookup(bg, other[0])
	require.NoError(t, err)
	require.Equal(t, "secret of other op-0", string(r.Result))
	require.NoError(t, cp.Close())

	// Past the erasure's end, a key of the scope is a new action.
	s.clock.Set(st.Until)
	r, err = s.db.Do(bg, victim[0], []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("a new action"), nil
	})
	require.NoError(t, err)
	require.Equal(t, "a new action", string(r.Result))
	require.Equal(t, uint32(1), r.Attempts)
}

// TestEraseScopeInput: bad input changes nothing; without a Keyring erasure still deletes.
func TestEraseScopeInput(t *testing.T) {
	s := newTestStore(t, nil)
	_, err := s.db.EraseScope(bg, "")
	require.ErrorIs(t, err, receipts.ErrInvalidKey)
	_, err = s.db.EraseScope(bg, string(make([]byte, receipts.MaxKeyPartLen+1)))
	require.ErrorIs(t, err, receipts.ErrInvalidKey)
	fillScope(t, s.db, "a", 3)
	st, err := s.db.EraseScope(bg, "a")
	require.NoError(t, err)
	require.Equal(t, int64(3), st.Records)
	require.False(t, st.KeyDestroyed)
	_, err = s.db.Lookup(bg, key("a", "op-0"))
	require.ErrorIs(t, err, receipts.ErrErased)
	st, err = s.db.EraseScope(bg, "never-used") // a scope with nothing: recorded all the same
	require.NoError(t, err)
	require.Zero(t, st.Records)
	_, err = s.db.Do(bg, key("never-used", "x"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, receipts.ErrErased)
	require.NoError(t, s.db.Close())
	_, err = s.db.EraseScope(bg, "a")
	require.ErrorIs(t, err, receipts.ErrClosed)
	s.db = nil
}

// TestEraseScopeConcurrent: claims, commits and renewals of the scope racing its erasure
// either land before it (and are erased) or find it: afterwards no record of the scope is
// left, and no call made after the erasure returned ran an action. (A call made before may
// run its action after: its claim landed before the erasure, and its commit writes nothing.)
func TestEraseScopeConcurrent(t *testing.T) {
	s := newTestStore(t, func(o *pebblestore.Options) { o.Keyring = newKeyring(t) })
	db := s.db
	var stop atomic.Bool
	var erased atomic.Bool // EraseScope returned
	var wg sync.WaitGroup
	var late atomic.Int64 // actions run by calls made after EraseScope returned
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k := key("victim", fmt.Sprintf("w%d-%d", w, i))
				after := erased.Load() // this call is made after EraseScope returned
				_, err := db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
					if after {
						late.Add(1)
					}
					if i%3 == 0 {
						if err := l.Renew(ctx); err != nil {
							return nil, receipts.NotPerformed(err)
						}
					}
					return []byte("r"), nil
				})
				if err != nil && !errors.Is(err, receipts.ErrErased) && !errors.Is(err, receipts.ErrLeaseLost) &&
					!errors.Is(err, receipts.ErrOutcomeUnknown) {
					t.Errorf("Do: %v", err)
					return
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	_, err := db.EraseScope(bg, "victim")
	require.NoError(t, err)
	erased.Store(true)
	time.Sleep(20 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	require.Zero(t, late.Load(), "calls made after the erasure returned ran their actions")
	for r, err := range db.Scan(bg, receipts.Filter{}) {
		require.NoError(t, err)
		t.Fatalf("a record of the erased scope survived: %v", r.Key)
	}
	st, err := db.EraseScope(bg, "victim") // erasing again finds nothing new
	require.NoError(t, err)
	c := countOf(t, db)
	require.Zero(t, c.Pending+c.Succeeded+c.Failed)
	_ = st
}
