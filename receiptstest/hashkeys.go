package receiptstest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// Keys at rest as keyed hashes (Options.HashKeys). An engine that records no settings
// refuses the option with receipts.ErrUnsupported, and these tests are skipped there.
var hashKeysTests = []test{
	{"CallsTakeAndAnswerRawKeys", testHashRoundTrip},
	{"ListingsShowHashes", testHashListings},
	{"ListedKeysWork", testHashListedKeys},
	{"RecordedWithTheStore", testHashRecorded},
	{"RefusedOnAStoreWithRawKeys", testHashRefused},
	{"WithEncryptionAndErasure", testHashPrivacy},
	{"HashKeyWrappedByTheKeyring", testHashWrapped},
}

// hashEnv opens a store with HashKeys (and mod), skipping the test on an engine that
// cannot keep it.
func hashEnv(t *testing.T, s Store, mod func(*receipts.Options)) *env {
	t.Helper()
	clock := NewClock(time.Time{})
	opts := receipts.Options{Retention: retention, LeaseTTL: leaseTTL, GCInterval: -1, Now: clock.Now, HashKeys: true}
	if mod != nil {
		mod(&opts)
	}
	db, err := s.Open(t, opts)
	if errors.Is(err, receipts.ErrUnsupported) {
		t.Skipf("this engine records no settings (Open with HashKeys: %v)", err)
	}
	require.NoError(t, err, "Store.Open")
	require.True(t, db.Options().HashKeys)
	e := &env{t: t, store: s, clock: clock, opts: opts, db: db}
	t.Cleanup(func() {
		if e.db != nil {
			require.NoError(t, e.db.Close())
		}
	})
	return e
}

// isHashed reports whether a listed key part is a stored (hashed) one.
func isHashed(s string) bool { return len(s) == 24 && strings.HasPrefix(s, "\x00h") }

func testHashRoundTrip(t *testing.T, s Store) {
	e := hashEnv(t, s, nil)
	k := key("alice@example.com", "refund-42")
	e.record(k)
	e.replays(k)
	r, err := e.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, k, r.Key, "Lookup answers with the key given")
	r = e.replay(k, "fp")
	require.Equal(t, k, r.Key, "a replay answers with the key given")
	_, _, err = e.db.Claim(bg, k, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	l := e.claim(key("alice@example.com", "refund-43"), "fp")
	require.Equal(t, key("alice@example.com", "refund-43"), l.Key())
	r, err = l.Commit(bg, []byte("ok"))
	require.NoError(t, err)
	require.Equal(t, l.Key(), r.Key, "Commit answers with the key given")
	_, _, err = e.db.Claim(bg, key("\x00hsomething", "x"), []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrInvalidKey, "a raw scope with the stored form's mark")
	// the same ID in two scopes is two keys
	e.record(key("carol", "refund-42"))
	e.replays(k)
	e.replays(key("carol", "refund-42"))
}

func testHashListings(t *testing.T, s Store) {
	e := hashEnv(t, s, nil)
	ks := []receipts.Key{key("alice", "1"), key("alice", "2"), key("bob", "1")}
	for _, k := range ks {
		e.record(k)
	}
	n := 0
	for r, err := range e.db.Scan(bg, receipts.Filter{}) {
		require.NoError(t, err)
		require.True(t, isHashed(r.Key.Scope) && isHashed(r.Key.ID), "listed %q", r.Key)
		id := string(e.db.ScopeID(r.Key.Scope)) // a listed scope names its scope
		require.True(t, id == string(e.db.ScopeID("alice")) || id == string(e.db.ScopeID("bob")), "ScopeID of %q", r.Key.Scope)
		n++
	}
	require.Equal(t, 3, n)
	n = 0
	for r, err := range e.db.Scan(bg, receipts.Filter{Scope: "alice"}) {
		require.NoError(t, err)
		require.Equal(t, "alice", r.Key.Scope, "the scope named by the filter is shown as given")
		require.True(t, isHashed(r.Key.ID))
		require.Contains(t, []string{"the result of alice/1", "the result of alice/2"}, string(r.Result))
		n++
	}
	require.Equal(t, 2, n)
	// the same scope's hash names it too, and tombstones are listed as records are
	for r, err := range e.db.Scan(bg, receipts.Filter{Scope: "alice"}) {
		require.NoError(t, err)
		var listed receipts.Key
		for x, err := range e.db.Scan(bg, receipts.Filter{}) {
			require.NoError(t, err)
			if x.Key.ID == r.Key.ID {
				listed = x.Key
			}
		}
		n := 0
		for _, err := range e.db.Scan(bg, receipts.Filter{Scope: listed.Scope}) {
			require.NoError(t, err)
			n++
		}
		require.Equal(t, 2, n)
		break
	}
}

func testHashListedKeys(t *testing.T, s Store) {
	e := hashEnv(t, s, nil)
	k := key("alice", "op")
	l := e.claim(k, "fp")
	pk := l.ProviderKey()
	require.NoError(t, l.Abandon(bg))
	var listed *receipts.Receipt
	for r, err := range e.db.Scan(bg, receipts.Filter{Abandoned: true}) {
		require.NoError(t, err)
		listed = r
	}
	require.NotNil(t, listed)
	require.NotEqual(t, k, listed.Key)
	require.Equal(t, pk, e.db.ProviderKey(listed.Key), "a listed key's ProviderKey is its lease's")
	r, err := e.db.Lookup(bg, listed.Key) // a listed key is found
	require.NoError(t, err)
	require.Equal(t, listed.Key, r.Key)
	l2, err := e.db.TakeOver(bg, listed)
	require.NoError(t, err)
	require.True(t, l2.Recovered())
	require.Equal(t, pk, l2.ProviderKey())
	_, err = l2.Commit(bg, resultOf(k))
	require.NoError(t, err)
	e.replays(k) // the key as given finds what the listed key committed
	// a stored scope with a raw ID is refused: the ID's hash needs the scope
	_, err = e.db.Lookup(bg, key(listed.Key.Scope, "op"))
	require.ErrorIs(t, err, receipts.ErrInvalidKey)
}

func testHashRecorded(t *testing.T, s Store) {
	e := hashEnv(t, s, nil)
	k := key("alice", "1")
	e.record(k)
	e.opts.HashKeys = false // a tool that does not know: the store says
	e.reopen()
	require.True(t, e.db.Options().HashKeys)
	e.replays(k)
}

func testHashRefused(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	e.record(key("alice", "1"))
	e.opts.HashKeys = true
	db, err := e.store.Reopen(t, e.db, e.opts)
	require.ErrorIs(t, err, receipts.ErrInvalidOptions)
	require.Nil(t, db)
	e.opts.HashKeys = false
	db, err = e.store.Reopen(t, e.db, e.opts)
	require.NoError(t, err)
	e.db = db
	require.False(t, e.db.Options().HashKeys)
	e.replays(key("alice", "1"))
}

func testHashPrivacy(t *testing.T, s Store) {
	e := hashEnv(t, s, func(o *receipts.Options) { o.Keyring = newKeyring(t); o.TombstoneWindow = time.Hour })
	k, other := key("alice", "1"), key("bob", "1")
	e.record(k)
	e.record(other)
	e.replays(k)
	e.clock.Advance(retention)
	_, _, err := e.db.Claim(bg, k, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrExpired, "tombstones work on hashed keys")
	for tb, err := range e.db.Tombstones(bg, "alice", 0) {
		require.NoError(t, err)
		require.Equal(t, "alice", tb.Key.Scope)
		require.True(t, isHashed(tb.Key.ID))
	}
	e.record(key("alice", "2"))
	_, err = e.db.EraseScope(context.Background(), "alice")
	require.NoError(t, err)
	e.erasedNow(key("alice", "2"))
	e.record(key("bob", "2"))
	e.replays(key("bob", "2"))
}

// testHashWrapped: with a Keyring, the hash key is wrapped by it: a store opened without the
// Keyring refuses to open (ErrSealed) rather than look keys up under another hash; after a
// rotation and RewrapKeys, the old key version can be retired.
func testHashWrapped(t *testing.T, s Store) {
	kr := newKeyring(t)
	e := hashEnv(t, s, func(o *receipts.Options) { o.Keyring = kr })
	k := key("alice", "1")
	e.record(k)
	e.opts.Keyring = nil
	db, err := e.store.Reopen(t, e.db, e.opts)
	require.ErrorIs(t, err, receipts.ErrSealed)
	require.Nil(t, db)
	e.opts.Keyring = kr
	db, err = e.store.Reopen(t, e.db, e.opts)
	require.NoError(t, err)
	e.db = db
	e.replays(k)
	v, err := kr.Rotate(bg)
	require.NoError(t, err)
	n, err := e.db.RewrapKeys(bg)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the scope's data key and the hash key")
	require.NoError(t, kr.Retire(bg, v-1))
	e.reopen()
	e.replays(k)
}
