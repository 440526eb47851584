package receiptstest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var badInputTests = []test{
	{"KeysAndFingerprints", testBadKeys},
	{"ResultTooLarge", testResultTooLarge},
	{"CanceledContext", testCanceledContext},
	{"InvalidOptions", testInvalidOptions},
	{"Defaults", testDefaults},
	{"HugeDurationsRefusedOrWorking", testHugeDurations},
}

// Empty or over-long Scope/ID and nil, empty or over-long fingerprints are
// refused with sentinels matching ErrInvalidArgument, by every method, and
// change nothing; the limits themselves are fine.
func testBadKeys(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
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
		{"empty both", key("", ""), fp, receipts.ErrInvalidKey},
		{"256-byte scope", key(long, "id"), fp, receipts.ErrInvalidKey},
		{"256-byte id", key("s", long), fp, receipts.ErrInvalidKey},
		{"nil fingerprint", key("s", "id"), nil, receipts.ErrInvalidFingerprint},
		{"empty fingerprint", key("s", "id"), []byte{}, receipts.ErrInvalidFingerprint},
		{"long fingerprint", key("s", "id"), make([]byte, receipts.MaxFingerprintLen+1), receipts.ErrInvalidFingerprint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, r, err := e.db.Claim(bg, tc.k, tc.fp)
			require.ErrorIs(t, err, tc.want)
			require.ErrorIs(t, err, receipts.ErrInvalidKey, "an invalid fingerprint matches ErrInvalidKey too")
			require.ErrorIs(t, err, receipts.ErrInvalidArgument)
			require.Nil(t, l)
			require.Nil(t, r)
			_, _, err = e.db.Claim(bg, tc.k, tc.fp, receipts.WaitForResult())
			require.ErrorIs(t, err, tc.want)
			_, err = e.db.Do(bg, tc.k, tc.fp, mustNotRun(t))
			require.ErrorIs(t, err, tc.want)
			require.ErrorIs(t, err, receipts.ErrInvalidArgument)
		})
	}
	for _, k := range []receipts.Key{key("", "x"), key("x", ""), key(long, "x"), key("x", long)} {
		_, err := e.db.Lookup(bg, k)
		require.ErrorIs(t, err, receipts.ErrInvalidKey)
		require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	}
	e.wantCounts(counts{})

	// 255-byte parts and a MaxFingerprintLen fingerprint are fine.
	big := make([]byte, receipts.MaxFingerprintLen)
	big[0] = 1
	l := e.claim(key(edge, edge), string(big))
	require.Equal(t, key(edge, edge), e.lookup(key(edge, edge)).Key)
	_, err := l.Commit(bg, []byte("ok"))
	require.NoError(t, err)
	e.wantCounts(counts{Succeeded: 1})
	n := 0
	for r, err := range e.db.Scan(bg, receipts.Filter{}) {
		require.NoError(t, err)
		require.Equal(t, key(edge, edge), r.Key, "bad input wrote nothing")
		n++
	}
	require.Equal(t, 1, n)

	// Scan: a State outside the known ones.
	for _, err := range e.db.Scan(bg, receipts.Filter{State: 9}) {
		require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	}
}

// A result over MaxResultSize is refused by Commit and Fail with
// ErrResultTooLarge, and the lease is still held; MaxResultSize is fine.
func testResultTooLarge(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("s", "big")
	l := e.claim(k, "fp")
	before := e.lookup(k)
	_, err := l.Commit(bg, make([]byte, receipts.MaxResultSize+1))
	require.ErrorIs(t, err, receipts.ErrResultTooLarge)
	require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	_, err = l.Fail(bg, make([]byte, receipts.MaxResultSize+1))
	require.ErrorIs(t, err, receipts.ErrResultTooLarge)
	sameReceipt(t, before, e.lookup(k))
	e.inProgress(k, "fp")
	r, err := l.Commit(bg, make([]byte, receipts.MaxResultSize))
	require.NoError(t, err)
	require.Len(t, r.Result, receipts.MaxResultSize)
	require.Len(t, e.replay(k, "fp").Result, receipts.MaxResultSize)
}

// A context that has ended: the context's error, and nothing written.
func testCanceledContext(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	k := key("s", "canceled")
	_, _, err := e.db.Claim(ctx, k, []byte("fp"))
	require.ErrorIs(t, err, context.Canceled)
	_, err = e.db.Do(ctx, k, []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, context.Canceled)
	e.gone(k)

	l := e.claim(k, "fp")
	before := e.lookup(k)
	for _, op := range []func() error{
		func() error { return l.Renew(ctx) },
		func() error { _, err := l.Commit(ctx, []byte("x")); return err },
		func() error { _, err := l.Fail(ctx, []byte("x")); return err },
		func() error { return l.Release(ctx) },
		func() error { return l.Abandon(ctx) },
	} {
		require.ErrorIs(t, op(), context.Canceled)
	}
	sameReceipt(t, before, e.lookup(k))
	_, err = l.Commit(bg, []byte("x"))
	require.NoError(t, err)
}

// Options that cannot work are refused by Open with ErrInvalidOptions.
func testInvalidOptions(t *testing.T, s Store) {
	for _, o := range []receipts.Options{
		{Retention: time.Minute, LeaseTTL: time.Minute},
		{Retention: time.Minute, LeaseTTL: 2 * time.Minute},
		{LeaseTTL: 48 * time.Hour},
		{Retention: -time.Hour},
		{LeaseTTL: -time.Second},
	} {
		o.GCInterval = -1
		o.Now = NewClock(time.Time{}).Now
		db, err := s.Open(t, o)
		require.ErrorIs(t, err, receipts.ErrInvalidOptions, "Retention %s, LeaseTTL %s", o.Retention, o.LeaseTTL)
		require.ErrorIs(t, err, receipts.ErrInvalidArgument)
		require.Nil(t, db)
	}
	// A reopen with options that cannot work is refused too, and the store
	// is as it was.
	e := newEnv(t, s, nil)
	r := e.commit(key("a", "k"), "fp", "kept")
	good := e.opts
	e.opts.LeaseTTL = 2 * e.opts.Retention
	db, err := s.Reopen(t, e.db, e.opts)
	require.ErrorIs(t, err, receipts.ErrInvalidOptions)
	require.Nil(t, db)
	e.opts = good
	e.reopen()
	sameReceipt(t, r, e.lookup(key("a", "k")))
}

// Zero options mean the defaults.
func testDefaults(t *testing.T, s Store) {
	e := newEnv(t, s, func(o *receipts.Options) { o.Retention, o.LeaseTTL = 0, 0 })
	o := e.db.Options()
	require.Equal(t, receipts.DefaultRetention, o.Retention)
	require.Equal(t, receipts.DefaultLeaseTTL, o.LeaseTTL)
	st := e.db.Stats()
	require.Equal(t, receipts.DefaultRetention, st.Retention)
	require.Equal(t, receipts.DefaultLeaseTTL, st.LeaseTTL)
	r := e.commit(key("a", "k"), "fp", "x")
	require.True(t, r.ExpiresAt.Equal(r.UpdatedAt.Add(receipts.DefaultRetention)))
}

// A Retention or LeaseTTL whose arithmetic would overflow is refused with
// ErrInvalidOptions, or it works: a receipt is replayed, not expired the
// moment it is written, and a lease stays live.
func testHugeDurations(t *testing.T, s Store) {
	for _, o := range []struct{ retention, ttl time.Duration }{
		{math.MaxInt64, 0},
		{math.MaxInt64, math.MaxInt64 - 1},
		{250 * 365 * 24 * time.Hour, 0}, // past about 236 years
	} {
		t.Run(fmt.Sprintf("retention=%d,ttl=%d", o.retention, o.ttl), func(t *testing.T) {
			clock := NewClock(time.Time{})
			db, err := s.Open(t, receipts.Options{Retention: o.retention, LeaseTTL: o.ttl, GCInterval: -1, Now: clock.Now})
			if err != nil {
				require.ErrorIs(t, err, receipts.ErrInvalidOptions)
				return
			}
			defer db.Close()
			k := key("a", "k")
			l, _, err := db.Claim(bg, k, []byte("fp"))
			require.NoError(t, err)
			_, _, err = db.Claim(bg, k, []byte("fp"))
			require.ErrorIs(t, err, receipts.ErrInProgress, "the lease is live")
			r, err := l.Commit(bg, []byte("done"))
			require.NoError(t, err)
			require.True(t, r.ExpiresAt.After(r.UpdatedAt), "ExpiresAt %s, UpdatedAt %s", r.ExpiresAt, r.UpdatedAt)
			clock.Advance(24 * time.Hour)
			_, got, err := db.Claim(bg, k, []byte("fp"))
			require.NoError(t, err)
			require.NotNil(t, got, "the receipt expired at once")
			require.Equal(t, []byte("done"), got.Result)
		})
	}
}
