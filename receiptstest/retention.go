package receiptstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var retentionTests = []test{
	{"ExactAtReadTime/gc=false", func(t *testing.T, s Store) { testRetentionExact(t, s, false) }},
	{"ExactAtReadTime/gc=true", func(t *testing.T, s Store) { testRetentionExact(t, s, true) }},
	{"AbandonedClaimKeptForTheWindow", testRetentionAbandoned},
	{"RenewedLeaseSurvivesEveryGC", testRetentionRenewedLease},
	{"ClockBackwards/LiveLeaseNotTakenOverEarly", testClockBackLease},
	{"ClockBackwards/ReceiptDoesNotExpireEarly", testClockBackReceipt},
	{"ClockBackwards/AfterGC", testClockBackAfterGC},
	{"ClockBackwards/AcrossARestart", testClockBackRestart},
	{"ReopenWithAnotherRetention", testReopenOtherRetention},
	{"GCConcurrentWithClaims", testGCConcurrentWithClaims},
}

// A receipt is visible until exactly UpdatedAt+Retention (1ns before: yes;
// at it: no), whatever GC did; the key then starts afresh; GC reports what
// it dropped.
func testRetentionExact(t *testing.T, s Store, withGC bool) {
	e := newEnv(t, s, noTombstones)
	gc := func() {
		if withGC {
			e.gc()
		}
	}
	k := key("acct", "refund-42")
	failed := key("acct", "refund-43")

	e.clock.Advance(7 * time.Minute) // off any boundary
	l := e.claim(k, "fp")
	e.clock.Advance(10 * time.Second)
	committedAt := e.clock.Now()
	r, err := l.Commit(bg, []byte("refunded"))
	require.NoError(t, err)
	// The window runs from the last write (the commit), not the claim.
	require.True(t, r.UpdatedAt.Equal(committedAt))
	require.True(t, r.ExpiresAt.Equal(committedAt.Add(retention)))

	rf, err := e.claim(failed, "fp").Fail(bg, []byte("card declined"))
	require.NoError(t, err)

	// Visible all through the window, GC or not.
	for e.clock.Now().Before(committedAt.Add(retention - 5*time.Minute)) {
		e.clock.Advance(5 * time.Minute)
		gc()
		e.visible(k, receipts.Succeeded)
		e.visible(failed, receipts.Failed)
	}
	// The last nanosecond of the window.
	e.clock.Set(committedAt.Add(retention - 1))
	gc()
	got := e.visible(k, receipts.Succeeded)
	sameReceipt(t, r, got)
	sameReceipt(t, r, e.replay(k, "fp"))
	_, err = e.db.Do(bg, failed, []byte("fp"), mustNotRun(t))
	require.ErrorIs(t, err, receipts.ErrFailed)
	e.wantCounts(counts{Succeeded: 1, Failed: 1})

	// At ExpiresAt: gone, and the key starts afresh.
	e.clock.Advance(1)
	gc()
	e.gone(k)
	e.gone(failed)
	e.wantCounts(counts{})
	if !withGC {
		require.Equal(t, int64(2), e.expired(), "expired, not yet collected")
	}
	// A retry of the same intent starts afresh (no replay of the expired
	// receipt), and the old intent no longer conflicts: the record is gone.
	fresh := e.claim(k, "fp")
	require.Equal(t, uint32(1), fresh.Attempt())
	require.False(t, fresh.Recovered())
	require.Greater(t, fresh.Token(), max(r.Token, rf.Token))
	_, err = fresh.Commit(bg, []byte("new"))
	require.NoError(t, err)
	e.fresh(failed, max(r.Token, rf.Token))

	// Long after, GC drops what expired, and nothing comes back.
	e.clock.Advance(3 * retention)
	gcst := e.gc()
	require.Positive(t, gcst.EpochsDropped, "GC reports what it dropped")
	require.Positive(t, gcst.Writes)
	require.True(t, gcst.At.Equal(e.clock.Now()), "GCStats.At is the store's time")
	e.gone(k)
	e.gone(failed)
	require.Zero(t, e.gc().EpochsDropped, "nothing left to drop")
	require.Zero(t, e.expired())
}

// fresh requires a Claim of k (with another intent) to start afresh: a
// lease, Attempt 1, not Recovered, a token above tokenAbove.
func (e *env) fresh(k receipts.Key, tokenAbove uint64) *receipts.Lease {
	e.t.Helper()
	l := e.claim(k, "another intent: the old one is gone")
	require.Equal(e.t, uint32(1), l.Attempt())
	require.False(e.t, l.Recovered())
	require.Greater(e.t, l.Token(), tokenAbove)
	return l
}

// Abandoned claims stay (Pending, Abandoned) until their last write +
// Retention; a takeover in the last nanosecond is Recovered; after it the
// key starts afresh and the crashed holder stays fenced.
func testRetentionAbandoned(t *testing.T, s Store) {
	e := newEnv(t, s, noTombstones)
	e.clock.Advance(3 * time.Minute)
	t0 := e.clock.Now()

	crashedA, crashedB := key("acct", "charge-1"), key("acct", "charge-2")
	la := e.claim(crashedA, "fp")
	lb := e.claim(crashedB, "fp")

	// A Do whose fn fails in an unknown way 20s in: abandoned at once, and
	// its window starts at the abandon (the last write).
	unknown := key("acct", "charge-3")
	_, err := e.db.Do(bg, unknown, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		e.clock.Advance(20 * time.Second)
		return nil, errors.New("connection reset")
	})
	require.Error(t, err)
	abandonedAt := t0.Add(20 * time.Second)
	r := e.visible(unknown, receipts.Pending)
	require.True(t, r.UpdatedAt.Equal(abandonedAt))
	require.True(t, r.Abandoned(e.clock.Now()))

	e.clock.Advance(leaseTTL) // every lease has run out
	for e.clock.Now().Before(t0.Add(retention - 10*time.Minute)) {
		e.clock.Advance(10 * time.Minute)
		e.gc()
		for _, k := range []receipts.Key{crashedA, crashedB, unknown} {
			r := e.visible(k, receipts.Pending)
			require.True(t, r.Abandoned(e.clock.Now()))
		}
		e.wantCounts(counts{Pending: 3, Abandoned: 3})
		n := 0
		for r, err := range e.db.Scan(bg, receipts.Filter{Abandoned: true}) {
			require.NoError(t, err)
			require.Equal(t, receipts.Pending, r.State)
			n++
		}
		require.Equal(t, 3, n)
	}

	// Last nanosecond of A's window: the next caller takes over and is told
	// to reconcile.
	e.clock.Set(t0.Add(retention - 1))
	e.gc()
	l := e.claim(crashedA, "fp")
	require.True(t, l.Recovered())
	require.Equal(t, uint32(2), l.Attempt())
	require.Equal(t, la.ProviderKey(), l.ProviderKey())
	_, err = l.Commit(bg, []byte("reconciled"))
	require.NoError(t, err)

	// At t0+R, B's window has ended: gone, and a claim starts afresh (the
	// crashed holder cannot come back: its token is fenced).
	e.clock.Advance(1)
	e.gc()
	e.gone(crashedB)
	e.visible(unknown, receipts.Pending) // abandoned 20s later
	fresh := e.fresh(crashedB, l.Token())
	_, err = lb.Commit(bg, []byte("late"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.ErrorIs(t, lb.Renew(bg), receipts.ErrLeaseLost)
	require.NoError(t, fresh.Release(bg))

	// The Do-abandoned claim: visible until abandonedAt+R, then gone.
	e.clock.Set(abandonedAt.Add(retention - 1))
	e.gc()
	e.visible(unknown, receipts.Pending)
	e.clock.Advance(1)
	e.gc()
	e.gone(unknown)
	e.fresh(unknown, l.Token())
}

// A lease renewed for three retention windows, with GC after every renewal
// and other receipts expiring all along, is never collected; its commit
// gets a full window.
func testRetentionRenewedLease(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("acct", "long-export")
	l := e.claim(k, "fp")

	start := e.clock.Now()
	dropped, i := 0, 0
	for e.clock.Now().Sub(start) < 3*retention {
		if i%30 == 0 {
			e.commit(key("acct", fmt.Sprintf("filler-%d", i)), "fp", "x")
		}
		i++
		e.clock.Advance(10 * time.Second)
		require.NoError(t, l.Renew(bg), "at +%s", e.clock.Now().Sub(start))
		dropped += e.gc().EpochsDropped
		if i%60 == 0 {
			e.inProgress(k, "fp")
			r := e.visible(k, receipts.Pending)
			require.Equal(t, l.Token(), r.Token)
			require.True(t, r.LeaseExpiresAt.Equal(e.clock.Now().Add(leaseTTL)))
		}
	}
	require.Positive(t, dropped, "GC dropped the expired fillers")
	e.gone(key("acct", "filler-0"))

	// The holder finishes after 3h: its commit lands, and the receipt gets a
	// full window from the commit.
	r, err := l.Commit(bg, []byte("exported"))
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Attempts)
	require.True(t, r.ExpiresAt.Equal(e.clock.Now().Add(retention)))
	e.clock.Advance(retention - 1)
	e.gc()
	e.visible(k, receipts.Succeeded)
	e.clock.Advance(1)
	e.gone(k)
}

// The clock steps back two hours while a lease is held: the lease is not
// taken over before its true expiry.
func testClockBackLease(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("acct", "wire")
	t0 := e.clock.Now()
	l := e.claim(k, "fp")

	e.clock.Advance(-2 * time.Hour) // NTP steps the clock back
	for range 4 {
		e.clock.Advance(leaseTTL)
		e.inProgress(k, "fp")
	}
	e.gc()
	// Back at the true time: live until exactly t0+TTL.
	e.clock.Set(t0.Add(leaseTTL - 1))
	e.inProgress(k, "fp")
	e.clock.Advance(1)
	l2 := e.claim(k, "fp")
	require.True(t, l2.Recovered())
	_, err := l.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
}

// The clock steps back three hours after a commit: the receipt does not
// expire early, and writes meanwhile use the store's time (which stands
// still), so their windows do not start in the past.
func testClockBackReceipt(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k, later := key("acct", "a"), key("acct", "b")
	e.clock.Advance(20 * time.Minute)
	t0 := e.clock.Now()
	r := e.commit(k, "fp", "done")

	e.clock.Advance(-3 * time.Hour)
	r2 := e.commit(later, "fp", "done")
	require.True(t, r2.UpdatedAt.Equal(t0), "UpdatedAt %s, want %s", r2.UpdatedAt, t0)
	require.True(t, r.ExpiresAt.Equal(r2.ExpiresAt))
	e.gc()
	e.visible(k, receipts.Succeeded)

	e.clock.Set(t0.Add(retention - 1))
	e.gc()
	e.visible(k, receipts.Succeeded)
	e.visible(later, receipts.Succeeded)
	e.clock.Advance(1)
	e.gone(k)
	e.gone(later)
}

// After GC dropped old receipts, the clock jumps back before them: nothing
// dropped comes back, and a new receipt keeps its whole window.
func testClockBackAfterGC(t *testing.T, s Store) {
	for _, reopen := range []bool{false, true} {
		t.Run(fmt.Sprintf("reopen=%v", reopen), func(t *testing.T) {
			e := newEnv(t, s, nil)
			for i := range 8 {
				e.commit(key("old", fmt.Sprint(i)), "fp", "x")
				e.clock.Advance(retention / 8)
			}
			e.clock.Advance(2 * retention)
			gcAt := e.clock.Now()
			require.Positive(t, e.gc().EpochsDropped)

			e.clock.Advance(-4 * retention)
			if reopen {
				e.reopen()
			}
			k := key("new", "after-jump")
			r := e.commit(k, "fp", "kept")
			if !reopen {
				require.True(t, r.UpdatedAt.Equal(gcAt), "the store's time never goes back")
			}
			e.gc()
			e.visible(k, receipts.Succeeded)
			for i := range 8 {
				e.gone(key("old", fmt.Sprint(i)))
			}
			e.clock.Set(r.ExpiresAt.Add(-1))
			e.gc()
			e.visible(k, receipts.Succeeded)
			e.clock.Advance(1)
			e.gone(k)
		})
	}
}

// The process restarts with its clock an hour behind: a lease from before
// the restart is not taken over early, a receipt does not expire early.
func testClockBackRestart(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k, done := key("acct", "held"), key("acct", "done")
	e.clock.Advance(14 * time.Minute)
	t0 := e.clock.Now()
	r := e.commit(done, "fp", "ok")
	e.claim(k, "fp")

	e.clock.Advance(-time.Hour)
	e.reopen()
	e.inProgress(k, "fp")
	e.visible(done, receipts.Succeeded)
	e.clock.Set(t0.Add(leaseTTL - 1))
	e.inProgress(k, "fp")
	e.clock.Advance(1)
	l := e.claim(k, "fp")
	require.True(t, l.Recovered())

	e.clock.Set(r.ExpiresAt.Add(-1))
	e.gc()
	e.visible(done, receipts.Succeeded)
	e.clock.Advance(1)
	e.gone(done)
}

// Retention is the one in force at read time: a reopen with a longer one
// shows a receipt that had expired but was not collected; a shorter one
// hides it; what GC dropped stays dropped; a lease still lasts LeaseTTL.
func testReopenOtherRetention(t *testing.T, s Store) {
	e := newEnv(t, s, nil) // Retention 1h
	t0 := e.clock.Now()
	a := e.commit(key("acct", "a"), "fp", "a")
	e.clock.Advance(55 * time.Minute)
	b := e.commit(key("acct", "b"), "fp", "b")
	e.clock.Advance(10 * time.Minute) // t0+65m: a has expired under 1h
	e.gone(a.Key)

	e.opts.Retention = 4 * time.Hour
	e.reopen()
	require.Equal(t, 4*time.Hour, e.db.Options().Retention)
	e.visible(a.Key, receipts.Succeeded)
	require.True(t, e.lookup(a.Key).ExpiresAt.Equal(t0.Add(4*time.Hour)))
	require.Zero(t, e.gc().EpochsDropped)
	e.visible(a.Key, receipts.Succeeded)

	// Shorter: 20m, at t0+70m. a (t0) and b (t0+55m) expire at t0+20m and
	// t0+75m.
	e.clock.Advance(5 * time.Minute)
	e.opts.Retention = 20 * time.Minute
	e.reopen()
	e.gone(a.Key)
	e.visible(b.Key, receipts.Succeeded)
	e.gc()
	e.gone(a.Key)
	e.visible(b.Key, receipts.Succeeded)
	e.clock.Advance(5*time.Minute - 1)
	e.visible(b.Key, receipts.Succeeded)
	e.clock.Advance(1)
	e.gone(b.Key)

	// Longer again, after a GC ran under the shorter window: what GC
	// dropped stays dropped, and the store's clock does not jump ahead.
	e.opts.Retention = 24 * time.Hour
	e.reopen()
	e.gone(a.Key)
	k := key("acct", "c")
	now := e.clock.Now()
	l := e.claim(k, "fp")
	r := e.lookup(k)
	require.True(t, r.UpdatedAt.Equal(now), "the store's time jumped ahead of the clock")
	require.True(t, r.LeaseExpiresAt.Equal(now.Add(leaseTTL)))
	e.clock.Advance(leaseTTL)
	l2 := e.claim(k, "fp")
	require.True(t, l2.Recovered(), "the crashed holder's lease should have run out after LeaseTTL")
	_, err := l.Commit(bg, nil)
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
}

// GC running all the time while claims and commits go on (and the clock
// moves) never takes a receipt away before its expiry; in the end it
// collects everything.
func testGCConcurrentWithClaims(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	db := e.db
	const workers, perWorker = 4, 100
	var (
		mu      sync.Mutex
		done    []*receipts.Receipt
		stop    = make(chan struct{})
		gcDone  = make(chan struct{})
		dropped int
		passes  atomic.Int64
	)
	go func() {
		defer close(gcDone)
		for {
			passes.Add(1)
			select {
			case <-stop:
				return
			default:
			}
			st, err := db.GC(bg)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			dropped += st.EpochsDropped
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				if i%10 == 0 {
					// Let a whole GC pass run between these claims, so GC
					// interleaves with them however fast the engine is.
					p := passes.Load()
					for passes.Load() < p+2 && !t.Failed() {
						time.Sleep(50 * time.Microsecond)
					}
				}
				k := key(fmt.Sprint("w", w), fmt.Sprint(i))
				claimedBy := e.clock.Now()
				l, _, err := db.Claim(bg, k, []byte("fp"))
				if err != nil {
					t.Error(err)
					return
				}
				e.clock.Advance(20 * time.Second)
				r, err := l.Commit(bg, []byte("x"))
				if errors.Is(err, receipts.ErrLeaseLost) && !e.clock.Now().Before(claimedBy.Add(retention)) {
					continue // the claim expired before the commit: right
				}
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := db.Lookup(bg, k); err != nil && e.clock.Now().Before(r.ExpiresAt) {
					t.Errorf("%s: %v before its expiry %s", k, err, r.ExpiresAt)
				}
				mu.Lock()
				done = append(done, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-gcDone
	require.False(t, t.Failed())
	require.Positive(t, dropped)
	last := done[0].ExpiresAt
	for _, r := range done {
		if r.ExpiresAt.After(last) {
			last = r.ExpiresAt
		}
	}
	for {
		now := e.clock.Now()
		for _, r := range done {
			_, err := db.Lookup(bg, r.Key)
			if now.Before(r.ExpiresAt) {
				require.NoError(t, err, "%s at %s, expires %s", r.Key, now, r.ExpiresAt)
			} else {
				require.ErrorIs(t, err, receipts.ErrNotFound)
			}
		}
		if now.After(last.Add(retention)) {
			break
		}
		e.clock.Advance(10 * time.Minute)
		e.gc()
	}
	e.gc()
	e.wantCounts(counts{})
	require.Zero(t, e.expired(), "GC collected everything")
}
