package receipts_test

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

func TestRestart(t *testing.T) {
	dir := t.TempDir() // on disk
	clock := receiptstest.NewClock(receiptstest.DefaultStart)
	opts := &receipts.Options{Now: clock.Now, GCInterval: -1}
	db, err := receipts.Open(dir, opts)
	require.NoError(t, err)
	committed := key("a", "committed")
	_, err = db.Do(bg, committed, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("item 1"), nil
	})
	require.NoError(t, err)
	pending := key("a", "pending")
	l, _, err := db.Claim(bg, pending, []byte("fp"))
	require.NoError(t, err)
	pk, tok := l.ProviderKey(), l.Token()
	require.NoError(t, db.Close())

	db, err = receipts.Open(dir, opts)
	require.NoError(t, err)
	defer db.Close()
	_, r, err := db.Claim(bg, committed, []byte("fp"))
	require.NoError(t, err)
	require.Equal(t, []byte("item 1"), r.Result)

	// A holder from before the restart keeps its lease until it runs out.
	_, _, err = db.Claim(bg, pending, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	clock.Advance(receipts.DefaultLeaseTTL)
	l2, _, err := db.Claim(bg, pending, []byte("fp"))
	require.NoError(t, err)
	require.True(t, l2.Recovered())
	require.Equal(t, pk, l2.ProviderKey(), "stable across attempts and restarts")
	require.Greater(t, l2.Token(), tok)
}

func TestBadInputChangesNothing(t *testing.T) {
	s := newTestStore(t, nil)
	long := strings.Repeat("x", receipts.MaxKeyPartLen+1)
	edge := strings.Repeat("x", receipts.MaxKeyPartLen)
	fp := []byte("fp")
	for _, tc := range []struct {
		name string
		k    receipts.Key
		fp   []byte
		want error
	}{
		{"empty scope", key("", "id"), fp, receipts.ErrInvalidKey},
		{"empty id", key("s", ""), fp, receipts.ErrInvalidKey},
		{"long scope", key(long, "id"), fp, receipts.ErrInvalidKey},
		{"long id", key("s", long), fp, receipts.ErrInvalidKey},
		{"nil fingerprint", key("s", "id"), nil, receipts.ErrInvalidFingerprint},
		{"empty fingerprint", key("s", "id"), []byte{}, receipts.ErrInvalidFingerprint},
		{"long fingerprint", key("s", "id"), make([]byte, receipts.MaxFingerprintLen+1), receipts.ErrInvalidFingerprint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := s.db.Claim(bg, tc.k, tc.fp)
			require.ErrorIs(t, err, tc.want)
			require.ErrorIs(t, err, receipts.ErrInvalidArgument)
			_, err = s.db.Do(bg, tc.k, tc.fp, func(context.Context, *receipts.Lease) ([]byte, error) {
				t.Fatal("fn must not run")
				return nil, nil
			})
			require.ErrorIs(t, err, tc.want)
		})
	}
	_, err := s.db.Lookup(bg, key("", "x"))
	require.ErrorIs(t, err, receipts.ErrInvalidKey)

	// 255-byte parts are fine.
	l, _, err := s.db.Claim(bg, key(edge, edge), fp)
	require.NoError(t, err)
	_, err = l.Commit(bg, make([]byte, receipts.MaxResultSize+1))
	require.ErrorIs(t, err, receipts.ErrResultTooLarge)
	r, err := s.db.Lookup(bg, key(edge, edge))
	require.NoError(t, err)
	require.Equal(t, receipts.Pending, r.State, "an oversized commit changes nothing")
	_, err = l.Commit(bg, make([]byte, receipts.MaxResultSize))
	require.NoError(t, err)

	// A canceled context: the context's error, nothing written.
	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, _, err = s.db.Claim(ctx, key("s", "canceled"), fp)
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.db.Lookup(bg, key("s", "canceled"))
	require.ErrorIs(t, err, receipts.ErrNotFound)

	st := countOf(t, s.db)
	require.Equal(t, int64(1), st.Succeeded)
	require.Equal(t, int64(0), st.Pending)
}

func TestKeysAreLengthPrefixed(t *testing.T) {
	s := newTestStore(t, nil)
	for _, k := range []receipts.Key{key("ab", "c"), key("a", "bc"), key("a\x00", "b"), key("a", "\x00b")} {
		r, err := s.db.Do(bg, k, []byte("fp-"+k.Scope+"|"+k.ID), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte(k.Scope + "|" + k.ID), nil
		})
		require.NoError(t, err)
		require.Equal(t, k.Scope+"|"+k.ID, string(r.Result))
	}
	n := 0
	for r, err := range s.db.Scan(bg, receipts.Filter{Scope: "a"}) {
		require.NoError(t, err)
		require.Equal(t, "a", r.Key.Scope)
		n++
	}
	require.Equal(t, 2, n)
}

func TestClosed(t *testing.T) {
	s := newTestStore(t, nil)
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	require.NoError(t, s.db.Close())
	require.NoError(t, s.db.Close(), "a second Close returns nil")

	_, _, err = s.db.Claim(bg, k, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = s.db.Do(bg, k, []byte("fp"), nil)
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = pebblestore.DoBatch(bg, s.db, k, []byte("fp"), nil)
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = s.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = s.db.GC(bg)
	require.ErrorIs(t, err, receipts.ErrClosed)
	require.ErrorIs(t, pebblestore.Checkpoint(s.db, "cp"), receipts.ErrClosed)
	for _, err := range s.db.Scan(bg, receipts.Filter{}) {
		require.ErrorIs(t, err, receipts.ErrClosed)
	}
	_, err = l.Commit(bg, nil)
	require.ErrorIs(t, err, receipts.ErrClosed)
	require.ErrorIs(t, l.Renew(bg), receipts.ErrClosed)
	require.ErrorIs(t, l.Release(bg), receipts.ErrClosed)
	s.db = nil
}

func TestCloseWaitsForInFlightDo(t *testing.T) {
	dir := t.TempDir()
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	k := key("a", "k")
	started, finish := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var inFlight *receipts.Receipt
	var inFlightErr error // checked by the test goroutine after wg.Wait
	wg.Add(1)
	go func() {
		defer wg.Done()
		inFlight, inFlightErr = db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			close(started)
			<-finish
			return []byte("landed"), nil
		})
	}()
	<-started
	// A waiter on the same key is told the store is closing.
	waiterErr := make(chan error)
	go func() {
		_, err := db.Do(bg, k, []byte("fp"), nil)
		waiterErr <- err
	}()
	closed := make(chan error)
	go func() { closed <- db.Close() }()
	require.ErrorIs(t, <-waiterErr, receipts.ErrClosed)
	select {
	case <-closed:
		t.Fatal("Close returned while Do was in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(finish)
	require.NoError(t, <-closed)
	wg.Wait()
	require.NoError(t, inFlightErr)
	require.Equal(t, []byte("landed"), inFlight.Result)

	db, err = receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	r, err := db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, []byte("landed"), r.Result)
}

func TestProviderKey(t *testing.T) {
	s := newTestStore(t, nil)
	valid := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	seen := map[string]bool{}
	for _, k := range []receipts.Key{key("acct-secret", "op-1"), key("acct-secret", "op-2"), key("other", "op-1")} {
		l, _, err := s.db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err)
		pk := l.ProviderKey()
		require.Regexp(t, valid, pk)
		require.NotContains(t, pk, k.Scope)
		require.NotContains(t, pk, k.ID)
		require.False(t, seen[pk], "distinct keys get distinct provider keys")
		seen[pk] = true
		require.NoError(t, l.Release(bg))
		l2, _, err := s.db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err)
		require.Equal(t, pk, l2.ProviderKey())
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, o := range []receipts.Options{
		{Retention: time.Minute, LeaseTTL: time.Minute},
		{Retention: time.Minute, LeaseTTL: 2 * time.Minute},
		{LeaseTTL: 48 * time.Hour},
		{Retention: -time.Hour},
		{LeaseTTL: -time.Second},
		{EpochWidth: -time.Second},
	} {
		before := o
		_, err := receipts.Open(t.TempDir(), &o)
		require.ErrorIs(t, err, receipts.ErrInvalidOptions, "%+v", o)
		require.ErrorIs(t, err, receipts.ErrInvalidArgument)
		require.Equal(t, before.Retention, o.Retention, "Open never changes the caller's options")
		require.Equal(t, before.LeaseTTL, o.LeaseTTL)
	}
	// Defaults.
	o := &pebblestore.Options{Pebble: &pebble.Options{FS: vfs.NewMem()}}
	db, err := pebblestore.Open("d", o)
	require.NoError(t, err)
	st := db.Stats()
	require.Equal(t, receipts.DefaultRetention, st.Retention)
	require.Equal(t, receipts.DefaultLeaseTTL, st.LeaseTTL)
	require.Equal(t, receipts.DefaultRetention/4, st.EpochWidth)
	require.Zero(t, o.Retention)
	require.Nil(t, o.Now)
	require.NoError(t, db.Close())
}

func TestUnknownFormat(t *testing.T) {
	fs := vfs.NewMem()
	pdb, err := pebble.Open("d", &pebble.Options{FS: fs})
	require.NoError(t, err)
	b, err := encoding.EncodeMeta(&encoding.Meta{Format: encoding.StoreFormat + 1, EpochWidth: int64(time.Hour), Secret: make([]byte, 32)})
	require.NoError(t, err)
	require.NoError(t, pdb.Set(keys.Meta, b, pebble.Sync))
	require.NoError(t, pdb.Close())
	_, err = pebblestore.Open("d", &pebblestore.Options{Pebble: &pebble.Options{FS: fs}})
	require.ErrorIs(t, err, receipts.ErrUnknownFormat)

	// Damaged meta is corruption, not a fresh store.
	pdb, err = pebble.Open("d", &pebble.Options{FS: fs})
	require.NoError(t, err)
	require.NoError(t, pdb.Set(keys.Meta, []byte("garbage"), pebble.Sync))
	require.NoError(t, pdb.Close())
	_, err = pebblestore.Open("d", &pebblestore.Options{Pebble: &pebble.Options{FS: fs}})
	require.ErrorIs(t, err, receipts.ErrCorrupt)
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	db, err := receipts.Open(dir, nil)
	require.NoError(t, err)
	defer db.Close()
	_, err = receipts.Open(dir, nil)
	require.ErrorIs(t, err, receipts.ErrLocked)
}

func TestApplicationDataAlongside(t *testing.T) {
	s := newTestStore(t, nil)
	_, err := s.db.Do(bg, key("a", "k"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("x"), nil
	})
	require.NoError(t, err)
	// The application's keys (anything not under the reserved prefix) are
	// never seen by the store.
	for _, k := range []string{"", "\x00", "\x00rcps", "\x00rcpu", "\xff", "app/1"} {
		require.NoError(t, pebblestore.DB(s.db).Set([]byte(k+"x"), []byte("app"), pebble.Sync))
	}
	n := 0
	for _, err := range s.db.Scan(bg, receipts.Filter{}) {
		require.NoError(t, err)
		n++
	}
	require.Equal(t, 1, n)
	s.reopen()
	_, err = s.db.Lookup(bg, key("a", "k"))
	require.NoError(t, err)
}

func TestCheckpoint(t *testing.T) {
	dir := t.TempDir()
	db, err := receipts.Open(filepath.Join(dir, "live"), &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	k := key("a", "k")
	_, err = db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil })
	require.NoError(t, err)
	require.NoError(t, pebblestore.Checkpoint(db, filepath.Join(dir, "copy")))
	cp, err := receipts.Open(filepath.Join(dir, "copy"), &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	defer cp.Close()
	r, err := cp.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, []byte("r"), r.Result)
}

func TestScanFilters(t *testing.T) {
	s := newTestStore(t, nil)
	do := func(k receipts.Key, err error) {
		_, _ = s.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte("r"), err
		})
	}
	do(key("s1", "ok"), nil)
	do(key("s1", "failed"), receipts.Permanent(errors.New("no")))
	do(key("s1", "abandoned"), errors.New("timeout"))
	do(key("s2", "ok"), nil)
	_, _, err := s.db.Claim(bg, key("s2", "live"), []byte("fp"))
	require.NoError(t, err)

	ids := func(f receipts.Filter) []string {
		var out []string
		for r, err := range s.db.Scan(bg, f) {
			require.NoError(t, err)
			out = append(out, r.Key.Scope+"/"+r.Key.ID)
		}
		return out
	}
	require.ElementsMatch(t, []string{"s1/ok", "s1/failed", "s1/abandoned", "s2/ok", "s2/live"}, ids(receipts.Filter{}))
	require.ElementsMatch(t, []string{"s1/ok", "s1/failed", "s1/abandoned"}, ids(receipts.Filter{Scope: "s1"}))
	require.ElementsMatch(t, []string{"s1/ok", "s2/ok"}, ids(receipts.Filter{State: receipts.Succeeded}))
	require.ElementsMatch(t, []string{"s1/abandoned"}, ids(receipts.Filter{Abandoned: true}))
	require.ElementsMatch(t, []string{"s2/live", "s1/abandoned"}, ids(receipts.Filter{State: receipts.Pending}))
	require.Len(t, ids(receipts.Filter{Limit: 2}), 2)
	for _, err := range s.db.Scan(bg, receipts.Filter{State: 9}) {
		require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	}

	st := countOf(t, s.db)
	require.Equal(t, int64(2), st.Succeeded)
	require.Equal(t, int64(1), st.Failed)
	require.Equal(t, int64(2), st.Pending)
	require.Equal(t, int64(1), st.Abandoned)
	require.Equal(t, 1, st.LiveEpochs)
}

func TestFingerprintCanonical(t *testing.T) {
	a, err := encoding.Fingerprint(map[string]any{"title": "Review evals", "n": 1, "tags": []string{"x"}})
	require.NoError(t, err)
	b, err := encoding.Fingerprint(map[string]any{"tags": []string{"x"}, "n": int64(1), "title": "Review evals"})
	require.NoError(t, err)
	require.Equal(t, a, b)
	c, err := encoding.Fingerprint(map[string]any{"title": "Different work", "n": 1, "tags": []string{"x"}})
	require.NoError(t, err)
	require.NotEqual(t, a, c)
	require.Len(t, a, encoding.FingerprintSize)
	_, err = encoding.Fingerprint(make(chan int))
	require.Error(t, err, "a value msgpack cannot encode")
}

func TestAbandonAndOptions(t *testing.T) {
	s := newTestStore(t, nil)
	o := s.db.Options()
	require.Equal(t, time.Hour, o.Retention)
	require.Equal(t, 30*time.Second, o.LeaseTTL)
	require.Equal(t, time.Hour/4, o.EpochWidth)

	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	require.NoError(t, l.Abandon(bg))
	// No waiting for the lease to run out: the next caller takes over now.
	l2, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	require.True(t, l2.Recovered())
	require.ErrorIs(t, l.Abandon(bg), receipts.ErrLeaseLost)
}

func TestLeaseKeepAlive(t *testing.T) {
	s := newTestStore(t, func(o *pebblestore.Options) { o.LeaseTTL = 30 * time.Millisecond })
	k := key("a", "k")
	l, _, err := s.db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancelCause(bg)
	defer cancel(nil)
	stop := l.KeepAlive(cancel)
	defer stop()

	// Renewals keep the lease live past its first expiry.
	first, err := s.db.Lookup(bg, k)
	require.NoError(t, err)
	s.clock.Advance(time.Second)
	require.Eventually(t, func() bool {
		cur, err := s.db.Lookup(bg, k)
		return err == nil && cur.LeaseExpiresAt.After(first.LeaseExpiresAt)
	}, 10*time.Second, time.Millisecond)

	// A takeover ends the effect's context with ErrLeaseLost. (A renewal
	// can land between the clock jump and the claim: jump again.)
	var thief *receipts.Lease
	require.Eventually(t, func() bool {
		s.clock.Advance(time.Minute)
		thief, _, err = s.db.Claim(bg, k, []byte("fp"))
		return err == nil
	}, 10*time.Second, time.Millisecond)
	require.True(t, thief.Recovered())
	select {
	case <-ctx.Done():
		require.ErrorIs(t, context.Cause(ctx), receipts.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("KeepAlive never noticed the lost lease")
	}
}
