package receiptstest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// Tombstones (Options.TombstoneWindow): for the window after a receipt's
// retention ends, a retry of its key gets ErrExpired whatever the
// fingerprint; after it, the key is a new action. An engine that keeps no
// tombstones refuses a positive window with receipts.ErrUnsupported, and
// these tests are skipped there, saying so (never a silent pass).
var tombstoneTests = []test{
	{"RetryPastRetentionIsExpired", testTombstoneExpired},
	{"WindowEndsExactly", testTombstoneWindowEnds},
	{"FailedAndAbandonedToo", testTombstoneFailedAbandoned},
	{"ReleasedLeavesNone", testTombstoneReleased},
	{"SurvivesRestart", testTombstoneRestart},
	{"GCKeepsThemThenDropsByEpoch", testTombstoneGC},
	{"Listed", testTombstoneListed},
	{"WindowRecorded", testTombstoneRecorded},
	{"DefaultWindow", testTombstoneDefaultWindow},
	{"KeyTime", testTombstoneKeyTime},
	{"BadWindow", testTombstoneBadWindow},
}

// tombWindow is the window the tests use: 3h after a Retention of 1h.
const tombWindow = 3 * time.Hour

// tombEnv opens a store with tombstones on (window tombWindow), changed by
// mod; it skips the test if the engine keeps none.
func tombEnv(t *testing.T, s Store, mod func(*receipts.Options)) *env {
	t.Helper()
	clock := NewClock(time.Time{})
	opts := receipts.Options{Retention: retention, LeaseTTL: leaseTTL, GCInterval: -1, TombstoneWindow: tombWindow, Now: clock.Now}
	if mod != nil {
		mod(&opts)
	}
	db, err := s.Open(t, opts)
	if errors.Is(err, receipts.ErrUnsupported) {
		t.Skipf("this engine keeps no tombstones (Open with TombstoneWindow %s: %v)", opts.TombstoneWindow, err)
	}
	require.NoError(t, err, "Store.Open")
	e := &env{t: t, store: s, clock: clock, opts: opts, db: db}
	t.Cleanup(func() {
		if e.db != nil {
			require.NoError(t, e.db.Close())
		}
	})
	if opts.TombstoneWindow > 0 {
		require.Equal(t, tombWindow, db.Options().TombstoneWindow, "TombstoneWindow in force")
	}
	return e
}

// expiredNow requires every way of retrying k (Claim with its own and
// another fingerprint, Do, Lookup) to get ErrExpired, running nothing.
func (e *env) expiredNow(k receipts.Key, fp string) {
	e.t.Helper()
	for _, f := range []string{fp, "another intent"} {
		l, r, err := e.db.Claim(bg, k, []byte(f))
		require.ErrorIs(e.t, err, receipts.ErrExpired, "claim %s (%s)", k, f)
		require.NotErrorIs(e.t, err, receipts.ErrNotFound, "a claim's ErrExpired is not ErrNotFound")
		require.Nil(e.t, l)
		require.Nil(e.t, r)
		var ee *receipts.ExpiredError
		require.ErrorAs(e.t, err, &ee)
		require.Equal(e.t, k, ee.Key)
	}
	r, err := e.db.Do(bg, k, []byte(fp), func(context.Context, *receipts.Lease) ([]byte, error) {
		e.t.Error("Do ran fn for a tombstoned key")
		return nil, nil
	})
	require.ErrorIs(e.t, err, receipts.ErrExpired, "Do %s", k)
	require.Nil(e.t, r)
	r, err = e.db.Lookup(bg, k)
	require.ErrorIs(e.t, err, receipts.ErrExpired, "lookup %s", k)
	require.ErrorIs(e.t, err, receipts.ErrNotFound, "lookup %s: no receipt", k)
	require.Nil(e.t, r)
	require.False(e.t, e.scanHas(k), "Scan lists records, not tombstones")
}

func testTombstoneExpired(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	k := key("acct", "refund-1")
	e.clock.Advance(7 * time.Minute)
	r := e.commit(k, "fp", "refunded")
	e.clock.Advance(retention - 1)
	require.Equal(t, "refunded", string(e.replay(k, "fp").Result), "the last nanosecond of retention replays")
	e.clock.Advance(1)
	e.expiredNow(k, "fp")
	var ee *receipts.ExpiredError
	_, _, err := e.db.Claim(bg, k, []byte("fp"))
	require.ErrorAs(t, err, &ee)
	require.True(t, r.ExpiresAt.Equal(ee.ExpiredAt), "ExpiredAt %v, want the receipt's ExpiresAt %v", ee.ExpiredAt, r.ExpiresAt)
	require.True(t, r.ExpiresAt.Add(tombWindow).Equal(ee.Until), "Until %v", ee.Until)
	// Other keys are not affected.
	e.fresh(key("acct", "refund-2"), r.Token)
}

func testTombstoneWindowEnds(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	k := key("acct", "refund-1")
	r := e.commit(k, "fp", "refunded")
	e.clock.Advance(retention + tombWindow - 1)
	e.expiredNow(k, "fp")
	e.clock.Advance(1) // the window has ended: a new action
	l := e.fresh(k, r.Token)
	r2, err := l.Commit(bg, []byte("again"))
	require.NoError(t, err)
	require.Equal(t, "again", string(e.replay(k, "another intent: the old one is gone").Result))
	// The new receipt gets its own tombstone.
	e.clock.Advance(retention)
	e.expiredNow(k, "fp")
	e.clock.Advance(tombWindow)
	e.fresh(k, r2.Token)
}

func testTombstoneFailedAbandoned(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	failed, abandoned, crashed := key("acct", "failed"), key("acct", "abandoned"), key("acct", "crashed")
	_, err := e.claim(failed, "fp").Fail(bg, []byte("declined"))
	require.NoError(t, err)
	require.NoError(t, e.claim(abandoned, "fp").Abandon(bg))
	e.claim(crashed, "fp") // its holder dies: the lease runs out, nobody takes over
	e.clock.Advance(retention)
	for _, k := range []receipts.Key{failed, abandoned, crashed} {
		e.expiredNow(k, "fp")
	}
}

func testTombstoneReleased(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	released, forgotten, renewed := key("acct", "released"), key("acct", "forgotten"), key("acct", "renewed")
	require.NoError(t, e.claim(released, "fp").Release(bg))
	require.NoError(t, e.claim(forgotten, "fp").Forget(bg))
	// A claim renewed into later epochs, then released: none of the epochs
	// it passed through keeps a marker.
	l := e.claim(renewed, "fp")
	for range 6 {
		e.clock.Advance(leaseTTL / 2)
		require.NoError(t, l.Renew(bg))
		e.clock.Advance(retention / 4)
		require.NoError(t, l.Renew(bg))
	}
	require.NoError(t, l.Release(bg))
	e.clock.Advance(retention)
	for _, k := range []receipts.Key{released, forgotten, renewed} {
		nl := e.claim(k, "other") // no effect happened: nothing to protect
		require.Equal(t, uint32(1), nl.Attempt())
		require.NoError(t, nl.Release(bg))
	}
	// A takeover released keeps the claim abandoned (the earlier outcome is
	// unknown), and so its tombstone.
	k := key("acct", "recovered")
	e.claim(k, "fp")
	e.clock.Advance(leaseTTL)
	tl := e.claim(k, "fp")
	require.True(t, tl.Recovered())
	require.NoError(t, tl.Release(bg))
	e.clock.Advance(retention)
	e.expiredNow(k, "fp")
}

func testTombstoneRestart(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	k := key("acct", "refund-1")
	e.commit(k, "fp", "refunded")
	e.reopen()
	e.clock.Advance(retention + time.Minute)
	e.expiredNow(k, "fp")
	e.reopen()
	e.expiredNow(k, "fp")
	e.opts.TombstoneWindow = 0 // the recorded window
	e.reopen()
	require.Equal(t, tombWindow, e.db.Options().TombstoneWindow)
	e.expiredNow(k, "fp")
}

// GC keeps tombstones for the whole window, then drops them by whole
// epochs: its writes do not grow with the number of keys.
func testTombstoneGC(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	width := e.db.Options().EpochWidth
	var keysOf [][]receipts.Key
	for ep := range 3 {
		var ks []receipts.Key
		for i := range 40 {
			k := key("acct", fmt.Sprintf("e%d-%d", ep, i))
			e.commit(k, "fp", "x")
			ks = append(ks, k)
		}
		keysOf = append(keysOf, ks)
		e.clock.Advance(width)
	}
	start := e.clock.Now()
	// Every receipt has expired; GC drops their epochs, not their tombstones.
	e.clock.Advance(retention + width)
	st := e.gc()
	require.Positive(t, st.EpochsDropped)
	require.Zero(t, st.TombstoneEpochsDropped, "tombstones dropped with their receipts")
	for _, ks := range keysOf {
		e.expiredNow(ks[0], "fp")
		e.expiredNow(ks[len(ks)-1], "fp")
	}
	// Past the window of the first epoch's keys only.
	e.clock.Set(start.Add(-3*width + retention + tombWindow + width))
	st = e.gc()
	gcWritesByEpoch(t, st, len(keysOf[0]))
	tombDropped := st.TombstoneEpochsDropped
	e.fresh(keysOf[0][0], 0)
	e.expiredNow(keysOf[2][0], "fp")
	// Past every window: the markers' epochs (an engine may group several
	// epochs' markers, and drop them once the newest is past its window) are
	// dropped by now.
	e.clock.Advance(3 * width)
	st = e.gc()
	gcWritesByEpoch(t, st, len(keysOf[0]))
	require.Positive(t, tombDropped+st.TombstoneEpochsDropped, "no epoch of tombstones dropped past every window")
	for _, ks := range keysOf[1:] {
		e.fresh(ks[1], 0)
	}
}

// gcWritesByEpoch requires a GC pass's writes to be O(epochs), not O(keys):
// a few per epoch (or partition) dropped, whatever their keys (perEpoch of
// them in each), as Pebble's one range deletion per kind or PostgreSQL's
// lease renewal, copy of the markers, detach and drop per partition.
func gcWritesByEpoch(t *testing.T, st receipts.GCStats, perEpoch int) {
	t.Helper()
	dropped := st.EpochsDropped + st.TombstoneEpochsDropped
	require.LessOrEqual(t, st.Writes, 1+4*dropped, "GC writes: O(epochs), not O(keys) (%d epochs dropped)", dropped)
	require.Less(t, st.Writes, perEpoch, "GC writes: fewer than the keys of one epoch")
}

func testTombstoneListed(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	k, live := key("acct", "refund-1"), key("acct", "live")
	r := e.commit(k, "fp", "refunded")
	e.clock.Advance(retention / 2)
	e.commit(live, "fp", "x")
	e.clock.Advance(retention / 2)
	var got []*receipts.Tombstone
	for tb, err := range e.db.Tombstones(bg, "", 0) {
		require.NoError(t, err)
		got = append(got, tb)
	}
	require.Len(t, got, 1, "only the expired key has a tombstone")
	require.Equal(t, k, got[0].Key)
	require.True(t, r.UpdatedAt.Equal(got[0].UsedAt))
	require.True(t, r.ExpiresAt.Equal(got[0].ExpiredAt))
	require.True(t, r.ExpiresAt.Add(tombWindow).Equal(got[0].Until))
	require.Equal(t, tombWindow, got[0].Left(e.clock.Now()))
	for range e.db.Tombstones(bg, "other scope", 0) {
		t.Fatal("a tombstone of another scope")
	}
	e.clock.Advance(tombWindow)
	for tb := range e.db.Tombstones(bg, "", 0) {
		require.Equal(t, live, tb.Key, "ended tombstones are not listed")
	}
}

func testTombstoneRecorded(t *testing.T, s Store) {
	e := tombEnv(t, s, nil)
	e.opts.TombstoneWindow = 0
	e.reopen()
	require.Equal(t, tombWindow, e.db.Options().TombstoneWindow, "zero means the recorded window")
	e.opts.TombstoneWindow = -1
	e.reopen()
	require.Negative(t, e.db.Options().TombstoneWindow, "negative turns them off")
	k := key("acct", "k")
	e.commit(k, "fp", "x")
	e.clock.Advance(retention)
	e.fresh(k, 0) // no tombstone while off
	e.opts.TombstoneWindow = 0
	e.reopen()
	require.Negative(t, e.db.Options().TombstoneWindow, "off is recorded too")
}

// A new store opened with a zero TombstoneWindow keeps tombstones for
// DefaultTombstoneWindow(Retention) (7 × Retention, at most
// MaxTombstoneWindow), on every engine that keeps them, and records it.
func testTombstoneDefaultWindow(t *testing.T, s Store) {
	e := tombEnv(t, s, func(o *receipts.Options) { o.TombstoneWindow = 0 })
	if e.db.Options().TombstoneWindow < 0 {
		t.Skip("this engine keeps no tombstones")
	}
	want := receipts.DefaultTombstoneWindow(retention)
	require.Equal(t, 7*retention, want)
	require.Equal(t, want, e.db.Options().TombstoneWindow, "the default window in force")
	e.opts.TombstoneWindow = 0
	e.reopen()
	require.Equal(t, want, e.db.Options().TombstoneWindow, "the default window is recorded")
}

// KeyTime: a key minted more than Retention + TombstoneWindow ago is
// ErrExpired without a lookup, whether or not it was ever claimed; a
// recent one is claimed as usual. It needs no engine support: it runs on
// every engine, with the window in force (none: Retention alone).
func testTombstoneKeyTime(t *testing.T, s Store) {
	e := newEnv(t, s, func(o *receipts.Options) { o.KeyTime = receipts.ULIDTime })
	now := e.clock.Now()
	tombWindow := e.window()
	old := key("acct", ulidAt(now.Add(-retention-tombWindow)))
	_, _, err := e.db.Claim(bg, old, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrExpired, "a key minted Retention + TombstoneWindow ago")
	_, err = e.db.Do(bg, old, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Error("fn ran for a key too old")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrExpired)
	recent := key("acct", ulidAt(now.Add(-retention-tombWindow+time.Millisecond)))
	require.NoError(t, e.claim(recent, "fp").Release(bg))
	e.claim(key("acct", "not-a-ulid"), "fp")
}

// ulidAt is a ULID minted at t (random part zero).
func ulidAt(t time.Time) string {
	const digits = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	ms := t.UnixMilli()
	b := []byte("0000000000" + "0000000000000000")
	for i := 9; i >= 0; i-- {
		b[i] = digits[ms&0x1f]
		ms >>= 5
	}
	return string(b)
}

func testTombstoneBadWindow(t *testing.T, s Store) {
	tombEnv(t, s, nil) // skips on an engine without tombstones
	for _, w := range []time.Duration{receipts.MaxTombstoneWindow + 1, receipts.MaxTombstoneEpochs*(retention/4) + 1} {
		clock := NewClock(time.Time{})
		db, err := s.Open(t, receipts.Options{Retention: retention, LeaseTTL: leaseTTL, GCInterval: -1, TombstoneWindow: w, Now: clock.Now})
		require.ErrorIs(t, err, receipts.ErrInvalidOptions, "TombstoneWindow %s", w)
		require.Nil(t, db)
	}
}
