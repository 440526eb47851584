package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// Retention: a receipt, or an abandoned claim, is visible until its last
// write + Retention and never after, whatever GC has or has not done; a live
// lease is never collected; the store's time never goes back.
//
// newTestStore: Retention 1h, LeaseTTL 30s, so the epoch width is 15m; the
// fake clock starts on an epoch boundary (12:00 UTC).

const (
	retR   = time.Hour
	retTTL = 30 * time.Second
	retW   = retR / 4
)

var retFP = []byte("fp")

// retCommit claims k and commits result at the current time.
func retCommit(t *testing.T, db *receipts.DB, k receipts.Key, result string) *receipts.Receipt {
	t.Helper()
	l, r, err := db.Claim(bg, k, retFP)
	require.NoError(t, err)
	require.Nil(t, r, "%s: already finished", k)
	r, err = l.Commit(bg, []byte(result))
	require.NoError(t, err)
	return r
}

// retVisible asserts that k is visible with the given state (Lookup and
// Scan), without writing anything.
func retVisible(t *testing.T, db *receipts.DB, k receipts.Key, state receipts.State) *receipts.Receipt {
	t.Helper()
	r, err := db.Lookup(bg, k)
	require.NoError(t, err, "%s should be visible", k)
	require.Equal(t, state, r.State)
	require.True(t, retScanHas(t, db, k), "Scan should list %s", k)
	return r
}

// retGone asserts that k is invisible to Lookup and Scan.
func retGone(t *testing.T, db *receipts.DB, k receipts.Key) {
	t.Helper()
	_, err := db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound, "%s should be gone", k)
	require.False(t, retScanHas(t, db, k), "Scan should not list %s", k)
}

func retScanHas(t *testing.T, db *receipts.DB, k receipts.Key) bool {
	t.Helper()
	for r, err := range db.Scan(bg, receipts.Filter{Scope: k.Scope}) {
		require.NoError(t, err)
		if r.Key == k {
			return true
		}
	}
	return false
}

// retFresh asserts that a Claim of k starts afresh: a lease, Attempt 1, not
// Recovered, with a token above every token seen before.
func retFresh(t *testing.T, db *receipts.DB, k receipts.Key, tokenAbove uint64) *receipts.Lease {
	t.Helper()
	l, r, err := db.Claim(bg, k, []byte("another intent: the old one is gone"))
	require.NoError(t, err)
	require.Nil(t, r)
	require.NotNil(t, l)
	require.Equal(t, uint32(1), l.Attempt())
	require.False(t, l.Recovered())
	require.Greater(t, l.Token(), tokenAbove)
	return l
}

// retGC runs GC and returns its figures.
func retGC(t *testing.T, db *receipts.DB) receipts.GCStats {
	t.Helper()
	st, err := db.GC(bg)
	require.NoError(t, err)
	return st
}

// retEpochs returns the epoch each stored record key is in (expired ones
// that GC has not dropped included), read straight from Pebble.
func retEpochs(t *testing.T, db *receipts.DB) map[receipts.Key]uint64 {
	t.Helper()
	it, err := pebblestore.DB(db).NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	require.NoError(t, err)
	defer it.Close()
	out := map[receipts.Key]uint64{}
	for it.First(); it.Valid(); it.Next() {
		e, scope, id, err := keys.ParseRecord(it.Key())
		require.NoError(t, err)
		out[key(scope, id)] = e
	}
	require.NoError(t, it.Error())
	return out
}

// retFloor reads the persisted GC floor (first epoch not dropped).
func retFloor(t *testing.T, db *receipts.DB) uint64 {
	t.Helper()
	v, closer, err := pebblestore.DB(db).Get(keys.GCFloor)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0
	}
	require.NoError(t, err)
	defer closer.Close()
	f, err := encoding.DecodeUint64(v)
	require.NoError(t, err)
	return f
}

func retEpochOf(t time.Time) uint64 { return uint64(t.UnixNano() / int64(retW)) }

func TestRetentionVisibleUntilWindowEndsGoneAfter(t *testing.T) {
	for _, withGC := range []bool{false, true} {
		t.Run(fmt.Sprintf("gc=%v", withGC), func(t *testing.T) {
			s := newTestStore(t, noTombstones) // tombstone_test.go: the same with them
			db := s.db
			gc := func() {
				if withGC {
					retGC(t, db)
				}
			}
			k := key("acct", "refund-42")
			failed := key("acct", "refund-43")

			s.clock.Advance(7 * time.Minute) // off an epoch boundary
			l, _, err := db.Claim(bg, k, retFP)
			require.NoError(t, err)
			s.clock.Advance(10 * time.Second)
			committedAt := s.clock.Now()
			r, err := l.Commit(bg, []byte("refunded"))
			require.NoError(t, err)
			// The window runs from the last write (the commit), not the claim.
			require.Equal(t, committedAt, r.UpdatedAt)
			require.Equal(t, committedAt.Add(retR), r.ExpiresAt)

			lf, _, err := db.Claim(bg, failed, retFP)
			require.NoError(t, err)
			rf, err := lf.Fail(bg, []byte("card declined"))
			require.NoError(t, err)

			// Visible all through the window, GC or not.
			for s.clock.Now().Before(committedAt.Add(retR - retW/3)) {
				s.clock.Advance(retW / 3)
				gc()
				retVisible(t, db, k, receipts.Succeeded)
				retVisible(t, db, failed, receipts.Failed)
			}
			// The last nanosecond of the window.
			s.clock.Advance(committedAt.Add(retR - 1).Sub(s.clock.Now()))
			gc()
			got := retVisible(t, db, k, receipts.Succeeded)
			require.Equal(t, []byte("refunded"), got.Result)
			l2, replay, err := db.Claim(bg, k, retFP)
			require.NoError(t, err)
			require.Nil(t, l2)
			require.Equal(t, []byte("refunded"), replay.Result)
			_, err = db.Do(bg, failed, retFP, func(context.Context, *receipts.Lease) ([]byte, error) {
				t.Fatal("a replay never runs fn")
				return nil, nil
			})
			require.ErrorIs(t, err, receipts.ErrFailed)
			require.Equal(t, int64(1), countOf(t, db).Succeeded)

			// One nanosecond later: gone, and the key starts afresh.
			s.clock.Advance(1)
			gc()
			retGone(t, db, k)
			retGone(t, db, failed)
			st := countOf(t, db)
			require.Zero(t, st.Succeeded+st.Failed+st.Pending)
			if !withGC {
				require.Equal(t, int64(2), st.Expired, "expired, not yet collected")
			}
			// The old intent no longer conflicts: the record is gone.
			fresh := retFresh(t, db, k, max(r.Token, rf.Token))
			_, err = fresh.Commit(bg, []byte("new"))
			require.NoError(t, err)
			retFresh(t, db, failed, max(r.Token, rf.Token))

			// Once the epoch is dead, GC drops it; nothing comes back.
			s.clock.Advance(retW + retR)
			gcst := retGC(t, db)
			require.Positive(t, gcst.EpochsDropped)
			retGone(t, db, k)
		})
	}
}

func TestRetentionAbandonedClaimKeptForWindow(t *testing.T) {
	s := newTestStore(t, noTombstones)
	db := s.db
	t0 := s.clock.Now().Add(3 * time.Minute)
	s.clock.Advance(3 * time.Minute)

	// Two holders crash right after claiming: their leases run out, the
	// claims stay, abandoned, until claim time + Retention.
	crashedA, crashedB := key("acct", "charge-1"), key("acct", "charge-2")
	la, _, err := db.Claim(bg, crashedA, retFP)
	require.NoError(t, err)
	lb, _, err := db.Claim(bg, crashedB, retFP)
	require.NoError(t, err)

	// A Do whose fn fails in an unknown way 20s in: abandoned at once, and
	// its window starts at the abandon (the last write).
	unknown := key("acct", "charge-3")
	_, err = db.Do(bg, unknown, retFP, func(context.Context, *receipts.Lease) ([]byte, error) {
		s.clock.Advance(20 * time.Second)
		return nil, errors.New("connection reset")
	})
	require.Error(t, err)
	abandonedAt := t0.Add(20 * time.Second)
	r := retVisible(t, db, unknown, receipts.Pending)
	require.Equal(t, abandonedAt, r.UpdatedAt)
	require.True(t, r.Abandoned(s.clock.Now()))

	s.clock.Advance(retTTL) // every lease has run out
	for s.clock.Now().Before(t0.Add(retR - retW/2)) {
		s.clock.Advance(retW / 2)
		retGC(t, db)
		for _, k := range []receipts.Key{crashedA, crashedB, unknown} {
			r := retVisible(t, db, k, receipts.Pending)
			require.True(t, r.Abandoned(s.clock.Now()))
		}
		st := countOf(t, db)
		require.Equal(t, int64(3), st.Pending)
		require.Equal(t, int64(3), st.Abandoned)
		n := 0
		for r, err := range db.Scan(bg, receipts.Filter{Abandoned: true}) {
			require.NoError(t, err)
			require.Equal(t, receipts.Pending, r.State)
			n++
		}
		require.Equal(t, 3, n)
	}

	// Last nanosecond of A's window: the next caller takes over and is told
	// to reconcile.
	s.clock.Advance(t0.Add(retR - 1).Sub(s.clock.Now()))
	retGC(t, db)
	l, rr, err := db.Claim(bg, crashedA, retFP)
	require.NoError(t, err)
	require.Nil(t, rr)
	require.True(t, l.Recovered())
	require.Equal(t, uint32(2), l.Attempt())
	require.Equal(t, l.ProviderKey(), la.ProviderKey())
	_, err = l.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)

	// At t0+R, B's window has ended: gone, and a claim starts afresh (the
	// crashed holder cannot come back: its token is fenced).
	s.clock.Advance(1)
	retGC(t, db)
	retGone(t, db, crashedB)
	retVisible(t, db, unknown, receipts.Pending) // abandoned 20s later
	fresh := retFresh(t, db, crashedB, l.Token())
	_, err = lb.Commit(bg, []byte("late"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.NoError(t, fresh.Release(bg))

	// The Do-abandoned claim: visible until abandonedAt+R, then gone.
	s.clock.Advance(abandonedAt.Add(retR - 1).Sub(s.clock.Now()))
	retGC(t, db)
	retVisible(t, db, unknown, receipts.Pending)
	s.clock.Advance(1)
	retGC(t, db)
	retGone(t, db, unknown)
	retFresh(t, db, unknown, l.Token())
}

func TestRetentionRenewedLeaseSurvivesEveryGC(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	k := key("acct", "long-export")
	l, _, err := db.Claim(bg, k, retFP)
	require.NoError(t, err)

	// Renew every 10s (TTL 30s) for three retention windows, with GC after
	// every renewal and receipts of other keys expiring all along.
	start := s.clock.Now()
	dropped, i := 0, 0
	for s.clock.Now().Sub(start) < 3*retR {
		if i%30 == 0 {
			retCommit(t, db, key("acct", fmt.Sprintf("filler-%d", i)), "x")
		}
		i++
		s.clock.Advance(10 * time.Second)
		require.NoError(t, l.Renew(bg), "at +%s", s.clock.Now().Sub(start))
		st := retGC(t, db)
		dropped += st.EpochsDropped
		if i%60 == 0 {
			_, _, err := db.Claim(bg, k, retFP)
			require.ErrorIs(t, err, receipts.ErrInProgress, "the lease is live")
			r := retVisible(t, db, k, receipts.Pending)
			require.Equal(t, l.Token(), r.Token)
			require.Equal(t, s.clock.Now().Add(retTTL), r.LeaseExpiresAt)
		}
	}
	require.GreaterOrEqual(t, dropped, 8, "GC dropped the epochs the claim was renewed out of")
	require.Equal(t, retFloor(t, db), retEpochOf(s.clock.Now().Add(-retR)))

	// The holder finishes after 3h: its commit lands, and the receipt gets a
	// full window from the commit.
	r, err := l.Commit(bg, []byte("exported"))
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Attempts)
	require.Equal(t, s.clock.Now().Add(retR), r.ExpiresAt)
	s.clock.Advance(retR - 1)
	retGC(t, db)
	retVisible(t, db, k, receipts.Succeeded)
}

func TestRetentionClockJumpsBackwards(t *testing.T) {
	t.Run("live lease not taken over early", func(t *testing.T) {
		s := newTestStore(t, nil)
		db := s.db
		k := key("acct", "wire")
		t0 := s.clock.Now()
		l, _, err := db.Claim(bg, k, retFP)
		require.NoError(t, err)

		s.clock.Advance(-2 * time.Hour) // NTP steps the clock back
		for range 4 {
			s.clock.Advance(retTTL)
			_, _, err := db.Claim(bg, k, retFP)
			var ip *receipts.InProgressError
			require.ErrorAs(t, err, &ip)
			require.LessOrEqual(t, ip.RetryAfter, retTTL)
		}
		retGC(t, db)
		// Back at the true time: live until exactly t0+TTL.
		s.clock.Advance(t0.Add(retTTL - 1).Sub(s.clock.Now()))
		_, _, err = db.Claim(bg, k, retFP)
		require.ErrorIs(t, err, receipts.ErrInProgress)
		s.clock.Advance(1)
		l2, _, err := db.Claim(bg, k, retFP)
		require.NoError(t, err)
		require.True(t, l2.Recovered())
		_, err = l.Commit(bg, []byte("stale"))
		require.ErrorIs(t, err, receipts.ErrLeaseLost)
	})

	t.Run("receipt does not expire early", func(t *testing.T) {
		s := newTestStore(t, nil)
		db := s.db
		k, later := key("acct", "a"), key("acct", "b")
		s.clock.Advance(20 * time.Minute)
		t0 := s.clock.Now()
		r := retCommit(t, db, k, "done")

		s.clock.Advance(-3 * time.Hour)
		// Writes while the clock is behind use the store's time (which
		// stands still), so their windows do not start in the past.
		r2 := retCommit(t, db, later, "done")
		require.Equal(t, t0, r2.UpdatedAt)
		require.Equal(t, r.ExpiresAt, r2.ExpiresAt)
		retGC(t, db)
		retVisible(t, db, k, receipts.Succeeded)

		s.clock.Advance(t0.Add(retR - 1).Sub(s.clock.Now()))
		retGC(t, db)
		retVisible(t, db, k, receipts.Succeeded)
		retVisible(t, db, later, receipts.Succeeded)
		s.clock.Advance(1)
		retGone(t, db, k)
		retGone(t, db, later)
	})

	t.Run("no write into a dropped epoch", func(t *testing.T) {
		for _, reopen := range []bool{false, true} {
			t.Run(fmt.Sprintf("reopen=%v", reopen), func(t *testing.T) {
				s := newTestStore(t, nil)
				for i := range 8 {
					retCommit(t, s.db, key("old", fmt.Sprint(i)), "x")
					s.clock.Advance(retW / 2)
				}
				s.clock.Advance(2 * retR)
				gcAt := s.clock.Now()
				st := retGC(t, s.db)
				require.Positive(t, st.EpochsDropped)
				floor := retFloor(t, s.db)
				require.Equal(t, retEpochOf(gcAt.Add(-retR)), floor)
				require.Empty(t, retEpochs(t, s.db))

				// The clock jumps back to before every dropped epoch.
				s.clock.Advance(-4 * retR)
				if reopen {
					s.reopen()
				}
				db := s.db
				k := key("new", "after-jump")
				r := retCommit(t, db, k, "kept")
				if reopen {
					// Restarted, the store's time is at least the start of
					// the floor (GC ran at least Retention after it).
					require.False(t, r.UpdatedAt.Before(time.Unix(0, int64(floor)*int64(retW))))
				} else {
					require.Equal(t, gcAt, r.UpdatedAt, "the store's time never goes back")
				}
				e := retEpochs(t, db)[k]
				require.GreaterOrEqual(t, e, floor, "written into dropped epoch %d (floor %d)", e, floor)

				// GC again at the jumped-back time, and when the true time
				// catches up: the new receipt stays for its whole window, and
				// nothing GC dropped comes back.
				retGC(t, db)
				retVisible(t, db, k, receipts.Succeeded)
				retGone(t, db, key("old", "7"))
				s.clock.Advance(r.ExpiresAt.Add(-1).Sub(s.clock.Now()))
				retGC(t, db)
				retVisible(t, db, k, receipts.Succeeded)
				s.clock.Advance(1)
				retGone(t, db, k)
			})
		}
	})

	t.Run("across a restart", func(t *testing.T) {
		s := newTestStore(t, nil)
		k, done := key("acct", "held"), key("acct", "done")
		s.clock.Advance(retW - time.Minute) // late in the epoch
		t0 := s.clock.Now()
		r := retCommit(t, s.db, done, "ok")
		_, _, err := s.db.Claim(bg, k, retFP)
		require.NoError(t, err)

		// The process restarts with its clock an hour behind.
		s.clock.Advance(-time.Hour)
		s.reopen()
		db := s.db
		_, _, err = db.Claim(bg, k, retFP)
		require.ErrorIs(t, err, receipts.ErrInProgress, "a lease from before the restart is not taken over early")
		retVisible(t, db, done, receipts.Succeeded)
		s.clock.Advance(t0.Add(retTTL - 1).Sub(s.clock.Now()))
		_, _, err = db.Claim(bg, k, retFP)
		require.ErrorIs(t, err, receipts.ErrInProgress)
		s.clock.Advance(1)
		l, _, err := db.Claim(bg, k, retFP)
		require.NoError(t, err)
		require.True(t, l.Recovered())

		s.clock.Advance(r.ExpiresAt.Add(-1).Sub(s.clock.Now()))
		retGC(t, db)
		retVisible(t, db, done, receipts.Succeeded)
		s.clock.Advance(1)
		retGone(t, db, done)
	})
}

func TestRetentionReopenWithAnotherRetention(t *testing.T) {
	s := newTestStore(t, nil) // created with Retention 1h: epoch width 15m, persisted
	t0 := s.clock.Now()
	a := retCommit(t, s.db, key("acct", "a"), "a") // epoch 0 (t0)
	s.clock.Advance(55 * time.Minute)
	b := retCommit(t, s.db, key("acct", "b"), "b") // epoch 3 (t0+55m)
	s.clock.Advance(10 * time.Minute)              // t0+65m: a has expired under 1h
	retGone(t, s.db, a.Key)

	// Longer: 4h. The epoch width stays 15m (lookups of absent keys now probe
	// up to 4h/15m+1 = 17 epochs instead of 5). Records still on disk are
	// judged by the new window: a, not yet collected, is visible again.
	s.opts.Retention = 4 * time.Hour
	s.reopen()
	st := s.db.Stats()
	require.Equal(t, 4*time.Hour, st.Retention)
	require.Equal(t, retW, st.EpochWidth)
	retVisible(t, s.db, a.Key, receipts.Succeeded)
	r, err := s.db.Lookup(bg, a.Key)
	require.NoError(t, err)
	require.Equal(t, t0.Add(4*time.Hour), r.ExpiresAt)
	require.Zero(t, retGC(t, s.db).EpochsDropped)

	// Shorter: 20m, at t0+70m. a (t0) and b (t0+55m) expire at t0+20m and
	// t0+75m; GC drops the epochs that ended before t0+50m.
	s.clock.Advance(5 * time.Minute)
	s.opts.Retention = 20 * time.Minute
	s.reopen()
	require.Equal(t, retW, s.db.Stats().EpochWidth)
	retGone(t, s.db, a.Key)
	retVisible(t, s.db, b.Key, receipts.Succeeded)
	gst := retGC(t, s.db)
	require.Equal(t, 1, gst.EpochsDropped)
	require.Equal(t, retEpochOf(t0.Add(50*time.Minute)), retFloor(t, s.db))
	require.Equal(t, map[receipts.Key]uint64{b.Key: retEpochOf(b.UpdatedAt)}, retEpochs(t, s.db))
	s.clock.Advance(5*time.Minute - 1)
	retVisible(t, s.db, b.Key, receipts.Succeeded)
	s.clock.Advance(1)
	retGone(t, s.db, b.Key)

	// Longer again, after a GC ran under the shorter window: what GC
	// dropped stays dropped, and the store's clock does not jump ahead (a
	// lease still lasts LeaseTTL of real time).
	s.opts.Retention = 24 * time.Hour
	s.reopen()
	retGone(t, s.db, a.Key)
	k := key("acct", "c")
	now := s.clock.Now()
	l, _, err := s.db.Claim(bg, k, retFP)
	require.NoError(t, err)
	r, err = s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, now, r.UpdatedAt, "the store's time jumped ahead of the clock")
	require.Equal(t, now.Add(retTTL), r.LeaseExpiresAt)
	s.clock.Advance(retTTL)
	l2, _, err := s.db.Claim(bg, k, retFP)
	require.NoError(t, err, "the crashed holder's lease should have run out after LeaseTTL")
	require.True(t, l2.Recovered())
	_, err = l.Commit(bg, nil)
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
}
