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
	"github.com/receiptstore/receipts/reconcile"
	"github.com/stretchr/testify/require"
)

// The Reconciler: abandoned claims driven through a user check.
var reconcilerTests = []test{
	{"SettlesEachWay", testReconcileEachWay},
	{"BacksOffWhileUnknown", testReconcileBackoff},
	{"BoundedConcurrency", testReconcileConcurrency},
	{"TwoReconcilersCheckEachClaimOnce", testReconcileTwo},
	{"OnlyItsScope", testReconcileScope},
	{"CheckPanicIsUnknown", testReconcilePanic},
	{"CheckRunsUnderARenewedLease", testReconcileRenews},
	{"BackgroundPassesStopOnClose", testReconcileBackground},
	{"DBCloseEndsACheckInFlight", testReconcileDBClose},
	{"InvalidOptions", testReconcileOptions},
}

// reconciler starts a Reconciler on e's store with background passes off
// (unless opts says otherwise), closed when the test ends.
func (e *env) reconciler(opts reconcile.Options) *reconcile.Reconciler {
	e.t.Helper()
	if opts.Interval == 0 {
		opts.Interval = -1
	}
	rc, err := reconcile.New(e.db, opts)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { require.NoError(e.t, rc.Close()) })
	return rc
}

// pass runs one reconciler pass and returns its stats.
func (e *env) pass(rc *reconcile.Reconciler) reconcile.Stats {
	e.t.Helper()
	st, err := rc.Run(bg)
	require.NoError(e.t, err)
	require.Equal(e.t, 1, st.Passes)
	return st
}

// counted returns the stats with the fields tests compare (no Duration).
func counted(st reconcile.Stats) reconcile.Stats {
	st.Duration = 0
	return st
}

// Check's answer decides: nil commits, Permanent fails, NotPerformed
// forgets, anything else leaves the claim abandoned (one more attempt).
// OnSettle hears of each; Check sees the listed record and a Recovered
// lease with the key's ProviderKey.
func testReconcileEachWay(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	pk := map[receipts.Key]string{}
	listed := map[receipts.Key]uint64{}
	for _, id := range []string{"commit", "fail", "forget", "unknown"} {
		k := key("a", id)
		l := e.claim(k, "fp-"+id)
		pk[k] = l.ProviderKey()
		require.NoError(t, l.Abandon(bg))
		listed[k] = l.Token()
	}
	// A live claim and a finished receipt are not abandoned: not listed.
	live := e.claim(key("a", "live"), "fp")
	e.commit(key("a", "done"), "fp", "ok")

	var mu sync.Mutex
	var settled []reconcile.Settlement
	rc := e.reconciler(reconcile.Options{
		Check: func(ctx context.Context, l *receipts.Lease, r *receipts.Receipt) ([]byte, error) {
			if !l.Recovered() || l.Attempt() != 2 || l.ProviderKey() != pk[r.Key] || r.Token != listed[r.Key] ||
				string(r.Fingerprint) != "fp-"+r.Key.ID || r.State != receipts.Pending {
				return nil, fmt.Errorf("check of %s: lease %d/%v/%s, listed %+v", r.Key, l.Attempt(), l.Recovered(), l.ProviderKey(), r)
			}
			switch r.Key.ID {
			case "commit":
				return []byte("it happened"), nil
			case "fail":
				return []byte("declined"), receipts.Permanent(errors.New("declined"))
			case "forget":
				return nil, receipts.NotPerformed(errors.New("never reached the provider"))
			}
			return nil, errors.New("provider timed out")
		},
		OnSettle: func(s reconcile.Settlement) {
			mu.Lock()
			settled = append(settled, s)
			mu.Unlock()
		},
	})
	st := e.pass(rc)
	require.Positive(t, st.Duration, "a pass reports its time")
	require.Equal(t, reconcile.Stats{Passes: 1, Listed: 4, Checked: 4, Committed: 1, Failed: 1, Forgotten: 1, Unknown: 1}, counted(st))

	r := e.replay(key("a", "commit"), "fp-commit")
	require.Equal(t, receipts.Succeeded, r.State)
	require.Equal(t, []byte("it happened"), r.Result)
	require.Equal(t, uint32(2), r.Attempts)
	r = e.replay(key("a", "fail"), "fp-fail")
	require.Equal(t, receipts.Failed, r.State)
	require.Equal(t, []byte("declined"), r.Result)
	e.gone(key("a", "forget"))
	r = e.visible(key("a", "unknown"), receipts.Pending)
	require.True(t, r.Abandoned(e.clock.Now()), "still unknown: abandoned again")
	require.Equal(t, uint32(2), r.Attempts)

	byKey := map[string]reconcile.Settlement{}
	for _, s := range settled {
		byKey[s.Key.ID] = s
	}
	require.Len(t, byKey, 4)
	require.Equal(t, reconcile.Committed, byKey["commit"].Outcome)
	require.NotNil(t, byKey["commit"].Receipt)
	require.Equal(t, reconcile.Failed, byKey["fail"].Outcome)
	require.Equal(t, receipts.Failed, byKey["fail"].Receipt.State)
	require.Equal(t, reconcile.Forgotten, byKey["forget"].Outcome)
	require.Equal(t, reconcile.Unknown, byKey["unknown"].Outcome)
	require.ErrorContains(t, byKey["unknown"].Err, "provider timed out")
	for _, s := range byKey {
		require.Equal(t, uint32(2), s.Attempt)
	}
	require.Equal(t, counted(st), counted(rc.Stats()))
	_, err := live.Commit(bg, []byte("ok"))
	require.NoError(t, err, "the live claim was left alone")
}

// A claim whose check stays unknown waits MinBackoff, then twice that, and
// so on up to MaxBackoff, by the store's clock; a settled one is gone.
func testReconcileBackoff(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	e.abandoned(k, "fp")
	var checks atomic.Int32
	var settle atomic.Bool
	rc := e.reconciler(reconcile.Options{
		MinBackoff: time.Minute,
		MaxBackoff: 4 * time.Minute,
		Check: func(context.Context, *receipts.Lease, *receipts.Receipt) ([]byte, error) {
			checks.Add(1)
			if settle.Load() {
				return []byte("found it"), nil
			}
			return nil, errors.New("unknown")
		},
	})
	checkedAfter := func(advance time.Duration) bool {
		t.Helper()
		e.clock.Advance(advance)
		st := e.pass(rc)
		require.Equal(t, 1, st.Listed)
		require.Equal(t, st.Checked, 1-st.Deferred)
		return st.Checked == 1
	}
	require.True(t, checkedAfter(0), "first pass")
	require.False(t, checkedAfter(0), "backing off 1m")
	require.False(t, checkedAfter(time.Minute-tick))
	require.True(t, checkedAfter(tick), "after 1m")
	require.False(t, checkedAfter(2*time.Minute-tick), "backing off 2m")
	require.True(t, checkedAfter(tick), "after 2m")
	require.False(t, checkedAfter(4*time.Minute-tick), "backing off 4m")
	require.True(t, checkedAfter(tick), "after 4m")
	require.False(t, checkedAfter(4*time.Minute-tick), "capped at MaxBackoff")
	settle.Store(true)
	require.True(t, checkedAfter(tick), "after 4m again")
	require.Equal(t, int32(5), checks.Load())
	r := e.replay(k, "fp")
	require.Equal(t, uint32(6), r.Attempts, "each check was one more attempt")
	st := e.pass(rc)
	require.Equal(t, 0, st.Listed)
}

// At most Concurrency checks run at once, and a pass does use them all.
func testReconcileConcurrency(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const n, limit = 20, 3
	for i := range n {
		e.abandoned(key("a", fmt.Sprintf("k%02d", i)), "fp")
	}
	var running, most atomic.Int32
	full := make(chan struct{})
	var fullOnce sync.Once
	rc := e.reconciler(reconcile.Options{
		Concurrency: limit,
		Check: func(ctx context.Context, _ *receipts.Lease, _ *receipts.Receipt) ([]byte, error) {
			cur := running.Add(1)
			defer running.Add(-1)
			for {
				m := most.Load()
				if cur <= m || most.CompareAndSwap(m, cur) {
					break
				}
			}
			if cur == limit {
				fullOnce.Do(func() { close(full) })
			}
			select { // the first checks wait until the slots are full
			case <-full:
			case <-time.After(30 * time.Second):
				return nil, errors.New("the slots never filled")
			}
			return []byte("ok"), nil
		},
	})
	st := e.pass(rc)
	require.Equal(t, n, st.Committed)
	require.Equal(t, int32(limit), most.Load(), "at most %d checks at once, and that many", limit)
	e.wantCounts(counts{Succeeded: n})
}

// Two reconcilers (on one store, or on two nodes of one database) race
// over the same claims: each claim is checked once, by one of them; the
// other skips it.
func testReconcileTwo(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const n = 30
	for i := range n {
		e.abandoned(key("a", fmt.Sprintf("k%02d", i)), "fp")
	}
	var mu sync.Mutex
	checked := map[receipts.Key]int{}
	opts := reconcile.Options{
		Concurrency: 4,
		Check: func(_ context.Context, l *receipts.Lease, r *receipts.Receipt) ([]byte, error) {
			mu.Lock()
			checked[r.Key]++
			mu.Unlock()
			return []byte("ok"), nil
		},
	}
	a, b := e.reconciler(opts), e.reconciler(opts)
	var wg sync.WaitGroup
	stats := make([]reconcile.Stats, 2)
	for i, rc := range []*reconcile.Reconciler{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[i], _ = rc.Run(bg)
		}()
	}
	wg.Wait()
	require.Len(t, checked, n)
	for k, c := range checked {
		require.Equal(t, 1, c, "%s checked %d times", k, c)
	}
	require.Equal(t, n, stats[0].Committed+stats[1].Committed)
	require.Equal(t, n, stats[0].Checked+stats[1].Checked)
	require.Equal(t, stats[0].Listed+stats[1].Listed-n, stats[0].Skipped+stats[1].Skipped, "every other listing is skipped")
	require.Zero(t, stats[0].Errors+stats[1].Errors)
	e.wantCounts(counts{Succeeded: n})
}

// Options.Scope limits the reconciler to one scope.
func testReconcileScope(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	e.abandoned(key("mine", "k"), "fp")
	e.abandoned(key("theirs", "k"), "fp")
	rc := e.reconciler(reconcile.Options{
		Scope: "mine",
		Check: func(context.Context, *receipts.Lease, *receipts.Receipt) ([]byte, error) { return []byte("ok"), nil },
	})
	st := e.pass(rc)
	require.Equal(t, 1, st.Committed)
	e.replay(key("mine", "k"), "fp")
	require.True(t, e.lookup(key("theirs", "k")).Abandoned(e.clock.Now()))
}

// A check that panics is an unknown outcome: the claim is abandoned again.
func testReconcilePanic(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	e.abandoned(k, "fp")
	var got reconcile.Settlement
	rc := e.reconciler(reconcile.Options{
		Check: func(context.Context, *receipts.Lease, *receipts.Receipt) ([]byte, error) {
			panic("provider client bug")
		},
		OnSettle: func(s reconcile.Settlement) { got = s },
	})
	st := e.pass(rc)
	require.Equal(t, 1, st.Unknown)
	require.Equal(t, reconcile.Unknown, got.Outcome)
	require.ErrorContains(t, got.Err, "provider client bug")
	r := e.lookup(k)
	require.True(t, r.Abandoned(e.clock.Now()))
	require.Equal(t, uint32(2), r.Attempts)
}

// Check runs under a lease that is renewed in the background, by the
// reconciler's LeaseFor. (Renewal runs on the wall clock: the lease is
// 30ms; the store's LeaseTTL is 30s.)
func testReconcileRenews(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	e.abandoned(k, "fp")
	const short = 30 * time.Millisecond
	rc := e.reconciler(reconcile.Options{
		LeaseFor: short,
		Check: func(ctx context.Context, l *receipts.Lease, _ *receipts.Receipt) ([]byte, error) {
			if l.TTL() != short {
				return nil, fmt.Errorf("lease of %s, want %s", l.TTL(), short)
			}
			first, err := e.db.Lookup(bg, k)
			if err != nil {
				return nil, err
			}
			now := e.clock.Advance(time.Second)
			deadline := time.Now().Add(5 * time.Second)
			for {
				cur, err := e.db.Lookup(bg, k)
				if err != nil {
					return nil, err
				}
				if cur.LeaseExpiresAt.After(first.LeaseExpiresAt) {
					if !cur.LeaseExpiresAt.Equal(now.Add(short)) {
						return nil, fmt.Errorf("renewed to %s, want %s", cur.LeaseExpiresAt, now.Add(short))
					}
					return []byte("ok"), nil
				}
				if time.Now().After(deadline) {
					return nil, errors.New("never renewed")
				}
				time.Sleep(time.Millisecond)
			}
		},
		OnSettle: func(s reconcile.Settlement) {
			if s.Outcome != reconcile.Committed {
				t.Errorf("settled %s: %v", s.Outcome, s.Err)
			}
		},
	})
	st, err := rc.Run(bg)
	require.NoError(t, err)
	require.Equal(t, 1, st.Committed, "stats %+v", st)
}

// With background passes on, the reconciler settles claims by itself; its
// Close stops it (no goroutine is left), and Run after Close is ErrClosed.
func testReconcileBackground(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	e.abandoned(k, "fp")
	settled := make(chan reconcile.Settlement, 16)
	rc, err := reconcile.New(e.db, reconcile.Options{
		Interval: 5 * time.Millisecond,
		Check:    func(context.Context, *receipts.Lease, *receipts.Receipt) ([]byte, error) { return []byte("bg"), nil },
		OnSettle: func(s reconcile.Settlement) { settled <- s },
	})
	require.NoError(t, err)
	s1 := recv(t, settled, "a background settlement")
	require.Equal(t, k, s1.Key)
	require.Equal(t, reconcile.Committed, s1.Outcome)
	require.NoError(t, rc.Close())
	require.NoError(t, rc.Close(), "idempotent")
	_, err = rc.Run(bg)
	require.ErrorIs(t, err, receipts.ErrClosed)
	require.GreaterOrEqual(t, rc.Stats().Passes, 1)
	e.replay(k, "fp")
}

// The DB's Close ends the context of a check in flight: the claim is
// abandoned again (one more attempt), and Close returns.
func testReconcileDBClose(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	e.abandoned(k, "fp")
	started := make(chan struct{})
	rc, err := reconcile.New(e.db, reconcile.Options{
		Interval: -1,
		Check: func(ctx context.Context, _ *receipts.Lease, _ *receipts.Receipt) ([]byte, error) {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		},
	})
	require.NoError(t, err)
	done := make(chan reconcile.Stats, 1)
	go func() {
		st, _ := rc.Run(bg)
		done <- st
	}()
	recv(t, started, "the check")
	require.NoError(t, e.db.Close())
	st := recv(t, done, "the pass")
	require.Equal(t, 1, st.Unknown, "stats %+v", st)
	require.NoError(t, rc.Close())
	e.reopen()
	r := e.lookup(k)
	require.True(t, r.Abandoned(e.clock.Now()))
	require.Equal(t, uint32(2), r.Attempts)
}

// Options outside their bounds are refused with ErrInvalidOptions.
func testReconcileOptions(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	check := func(context.Context, *receipts.Lease, *receipts.Receipt) ([]byte, error) { return nil, nil }
	for name, o := range map[string]reconcile.Options{
		"no Check":           {},
		"negative conc.":     {Check: check, Concurrency: -1},
		"conc. too high":     {Check: check, Concurrency: reconcile.MaxConcurrency + 1},
		"interval too short": {Check: check, Interval: time.Nanosecond},
		"max < min backoff":  {Check: check, Interval: -1, MinBackoff: time.Hour, MaxBackoff: time.Minute},
		"negative backoff":   {Check: check, Interval: -1, MinBackoff: -time.Second},
		"LeaseFor too long":  {Check: check, Interval: -1, LeaseFor: retention},
		"negative LeaseFor":  {Check: check, Interval: -1, LeaseFor: -time.Second},
	} {
		rc, err := reconcile.New(e.db, o)
		require.ErrorIs(t, err, receipts.ErrInvalidOptions, name)
		require.Nil(t, rc, name)
	}
	require.NoError(t, e.db.Close())
	_, err := reconcile.New(e.db, reconcile.Options{Check: check})
	require.ErrorIs(t, err, receipts.ErrClosed)
}
