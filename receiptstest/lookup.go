package receiptstest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var lookupTests = []test{
	{"EveryState", testLookupEveryState},
}

var beforeReplayTests = []test{
	{"BlocksEveryReplay", testBeforeReplayBlocks},
	{"NotCalledOnFirstExecution", testBeforeReplayNotOnFirst},
}

// Lookup: ErrNotFound for a key never claimed or released; a Pending claim
// is visible with its lease; then the receipt.
func testLookupEveryState(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	r, err := e.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound)
	require.Nil(t, r)

	l := e.claim(k, "fp")
	p := e.lookup(k)
	require.Equal(t, receipts.Pending, p.State)
	require.Equal(t, l.Token(), p.Token)
	require.Equal(t, []byte("fp"), p.Fingerprint)
	require.True(t, p.LeaseExpiresAt.Equal(e.clock.Now().Add(leaseTTL)))
	require.True(t, p.ExpiresAt.Equal(p.UpdatedAt.Add(retention)))
	require.NoError(t, l.Release(bg))
	_, err = e.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound)

	got := e.commit(k, "fp", "done")
	sameReceipt(t, got, e.lookup(k))
	_, err = e.db.Lookup(bg, key("a", "other"))
	require.ErrorIs(t, err, receipts.ErrNotFound)
	_, err = e.db.Lookup(bg, key("b", "k"))
	require.ErrorIs(t, err, receipts.ErrNotFound, "another scope")
}

// BeforeReplay runs before any stored result is exposed (Claim and Do
// replays, Lookup); its error is returned and nothing is exposed.
func testBeforeReplayBlocks(t *testing.T, s Store) {
	denied := errors.New("caller no longer authorized")
	var mu sync.Mutex
	var deny bool
	var seen []receipts.Key
	e := newEnv(t, s, func(o *receipts.Options) {
		o.BeforeReplay = func(ctx context.Context, r *receipts.Receipt) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, r.Key)
			if deny {
				return denied
			}
			return nil
		}
	})
	setDeny := func(v bool) { mu.Lock(); deny = v; mu.Unlock() }
	k := key("a", "k")
	_, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("secret result"), nil
	})
	require.NoError(t, err, "a first execution is not a replay")
	kf := key("a", "failed")
	_, err = e.claim(kf, "fp").Fail(bg, []byte("secret failure"))
	require.NoError(t, err)

	setDeny(true)
	for _, k := range []receipts.Key{k, kf} {
		l, r, err := e.db.Claim(bg, k, []byte("fp"))
		require.ErrorIs(t, err, denied)
		require.Nil(t, l)
		require.Nil(t, r)
		l, r, err = e.db.Claim(bg, k, []byte("fp"), receipts.WaitForResult())
		require.ErrorIs(t, err, denied)
		require.Nil(t, l)
		require.Nil(t, r)
		r, err = e.db.Do(bg, k, []byte("fp"), mustNotRun(t))
		require.ErrorIs(t, err, denied)
		require.Nil(t, r)
		r, err = e.db.Lookup(bg, k)
		require.ErrorIs(t, err, denied)
		require.Nil(t, r)
	}

	setDeny(false)
	r := e.lookup(k)
	require.Equal(t, []byte("secret result"), r.Result)
	mu.Lock()
	defer mu.Unlock()
	for _, sk := range seen {
		require.Contains(t, []receipts.Key{k, kf}, sk, "BeforeReplay sees the key it guards")
	}
	require.NotEmpty(t, seen)
}

// BeforeReplay is not called for a first execution, a takeover, or a
// claim that finds the key in progress.
func testBeforeReplayNotOnFirst(t *testing.T, s Store) {
	var mu sync.Mutex
	calls := 0
	e := newEnv(t, s, func(o *receipts.Options) {
		o.BeforeReplay = func(ctx context.Context, r *receipts.Receipt) error {
			mu.Lock()
			calls++
			mu.Unlock()
			return errors.New("denied")
		}
	})
	k := key("a", "k")
	l := e.claim(k, "fp")
	e.inProgress(k, "fp")
	require.NoError(t, l.Abandon(bg))
	l = e.claim(k, "fp")
	require.True(t, l.Recovered())
	_, err := l.Commit(bg, []byte("x"))
	require.NoError(t, err)
	_, err = e.db.Do(bg, key("a", "k2"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("y"), nil
	})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, calls)
}
