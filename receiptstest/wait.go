package receiptstest

import (
	"context"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var waitTests = []test{
	{"WaitersGetTheHoldersReceipt", testWaitersGetTheReceipt},
	{"ReleaseHandsTheKeyToOneWaiter", testReleaseHandsKeyToOneWaiter},
	{"WaiterTakesOverExpiredLease", testWaiterTakesOverExpiredLease},
	{"WaiterTakesOverAbandonedClaim", testWaiterTakesOverAbandoned},
	{"WaitAtMost", testWaitAtMost},
	{"DoWaitsForTheHolder", testDoWaitsForHolder},
	{"DoTakesOverWhenTheHolderReleases", testDoTakesOverOnRelease},
	{"WaitAtMostNonPositiveLooksOnce", testWaitAtMostNonPositive},
}

// claimAsync runs Claim in a goroutine and sends what it returned.
func (e *env) claimAsync(ctx context.Context, k receipts.Key, fp string, out chan<- result, opts ...receipts.ClaimOption) {
	go func() {
		l, r, err := e.db.Claim(ctx, k, []byte(fp), opts...)
		out <- result{l, r, err}
	}()
}

// letWaitersWait gives goroutines just started a moment to begin waiting.
// Correctness never depends on it: a goroutine that is late claims after
// the event instead of waiting for it, and the test only gets weaker.
func letWaitersWait() { time.Sleep(5 * time.Millisecond) }

// Every waiter gets the holder's receipt once it commits.
func testWaitersGetTheReceipt(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	out := make(chan result, 4)
	for range 4 {
		e.claimAsync(bg, k, "fp", out, receipts.WaitForResult())
	}
	letWaitersWait()
	got, err := l.Commit(bg, []byte("done"))
	require.NoError(t, err)
	for range 4 {
		o := recv(t, out, "a waiter")
		require.NoError(t, o.err)
		require.Nil(t, o.l)
		sameReceipt(t, got, o.r)
	}
}

// A release hands the key to exactly one waiter (Attempt 1, not
// Recovered); the others wait on for that one's outcome.
func testReleaseHandsKeyToOneWaiter(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	const n = 3
	out := make(chan result, n)
	for range n {
		e.claimAsync(bg, k, "fp", out, receipts.WaitForResult())
	}
	letWaitersWait()
	require.NoError(t, l.Release(bg))
	first := recv(t, out, "the waiter given the key")
	require.NoError(t, first.err)
	require.NotNil(t, first.l, "a release hands the key over, not a receipt")
	require.Nil(t, first.r)
	require.Equal(t, uint32(1), first.l.Attempt())
	require.False(t, first.l.Recovered())
	require.Greater(t, first.l.Token(), l.Token())
	select {
	case o := <-out:
		t.Fatalf("a second waiter returned while the key is held: %+v", o)
	case <-time.After(20 * time.Millisecond):
	}
	got, err := first.l.Commit(bg, []byte("by waiter"))
	require.NoError(t, err)
	for range n - 1 {
		o := recv(t, out, "a waiter")
		require.NoError(t, o.err)
		require.Nil(t, o.l, "one lease only")
		sameReceipt(t, got, o.r)
	}
}

// A waiter takes over a holder whose lease runs out (nobody renews it).
func testWaiterTakesOverExpiredLease(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	old := e.claim(k, "fp")
	out := make(chan result, 1)
	e.claimAsync(bg, k, "fp", out, receipts.WaitForResult())
	letWaitersWait()
	e.clock.Advance(leaseTTL + time.Second) // the holder died: nobody renews
	o := recv(t, out, "the waiter")
	require.NoError(t, o.err)
	require.NotNil(t, o.l)
	require.True(t, o.l.Recovered())
	require.Equal(t, uint32(2), o.l.Attempt())
	require.Greater(t, o.l.Token(), old.Token())
	_, err := old.Commit(bg, []byte("stale"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
}

// A waiter takes over an abandoned claim at once.
func testWaiterTakesOverAbandoned(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	out := make(chan result, 1)
	e.claimAsync(bg, k, "fp", out, receipts.WaitForResult())
	letWaitersWait()
	require.NoError(t, l.Abandon(bg))
	o := recv(t, out, "the waiter")
	require.NoError(t, o.err)
	require.NotNil(t, o.l)
	require.True(t, o.l.Recovered())
	require.Equal(t, uint32(2), o.l.Attempt())
}

// WaitAtMost(d): once d has passed, a plain in-progress answer (not the
// context's error); within d, the holder's receipt.
func testWaitAtMost(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")

	start := time.Now()
	_, _, err := e.db.Claim(bg, k, []byte("fp"), receipts.WaitAtMost(20*time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "it waited")
	var ip *receipts.InProgressError
	require.ErrorAs(t, err, &ip)
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.Positive(t, ip.RetryAfter)
	require.LessOrEqual(t, ip.RetryAfter, leaseTTL)
	require.NotErrorIs(t, err, context.DeadlineExceeded)

	// The context still bounds it (given time enough for the first decision: a context that
	// ends before the engine answered once is the context's error alone).
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, _, err = e.db.Claim(ctx, k, []byte("fp"), receipts.WaitAtMost(time.Minute))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// The holder commits within the bound: the waiter gets the receipt.
	out := make(chan result, 1)
	e.claimAsync(bg, k, "fp", out, receipts.WaitAtMost(time.Minute))
	letWaitersWait()
	got, err := l.Commit(bg, []byte("done"))
	require.NoError(t, err)
	o := recv(t, out, "the waiter")
	require.NoError(t, o.err)
	sameReceipt(t, got, o.r)

	// A free key: a lease at once.
	l2 := e.claim(key("a", "free"), "fp", receipts.WaitAtMost(time.Minute))
	require.Equal(t, uint32(1), l2.Attempt())
}

// Do waits for an in-flight holder and returns its receipt without calling fn.
func testDoWaitsForHolder(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	out := make(chan result, 1)
	go func() {
		r, err := e.db.Do(bg, k, []byte("fp"), mustNotRun(t))
		out <- result{r: r, err: err}
	}()
	letWaitersWait()
	got, err := l.Commit(bg, []byte("from holder"))
	require.NoError(t, err)
	o := recv(t, out, "Do")
	require.NoError(t, o.err)
	sameReceipt(t, got, o.r)
}

// Do waiting on a holder that releases takes the key and runs fn.
func testDoTakesOverOnRelease(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	type ran struct {
		attempt   uint32
		recovered bool
	}
	fnRan := make(chan ran, 1)
	out := make(chan result, 1)
	go func() {
		r, err := e.db.Do(bg, k, []byte("fp"), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
			fnRan <- ran{l.Attempt(), l.Recovered()}
			return []byte("by the waiter"), nil
		})
		out <- result{r: r, err: err}
	}()
	letWaitersWait()
	require.NoError(t, l.Release(bg))
	o := recv(t, out, "Do")
	require.NoError(t, o.err)
	require.Equal(t, []byte("by the waiter"), o.r.Result)
	require.Equal(t, ran{1, false}, recv(t, fnRan, "fn"))
}

// WaitAtMost(d) with d <= 0 looks once and answers: in progress at once
// (not the context's error), a lease for a free key, the receipt for a
// finished one.
func testWaitAtMostNonPositive(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "held")
	l := e.claim(k, "fp")
	for _, d := range []time.Duration{0, -1, -time.Hour} {
		ctx, cancel := context.WithTimeout(bg, 2*time.Second) // bounds a hang, if it waited
		start := time.Now()
		_, _, err := e.db.Claim(ctx, k, []byte("fp"), receipts.WaitAtMost(d))
		cancel()
		require.Less(t, time.Since(start), time.Second, "WaitAtMost(%s) waited", d)
		var ip *receipts.InProgressError
		require.ErrorAs(t, err, &ip, "WaitAtMost(%s)", d)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "WaitAtMost(%s)", d)
		require.Positive(t, ip.RetryAfter)
	}
	free := e.claim(key("a", "free"), "fp", receipts.WaitAtMost(0))
	require.Equal(t, uint32(1), free.Attempt())
	got, err := l.Commit(bg, []byte("done"))
	require.NoError(t, err)
	sameReceipt(t, got, e.replay(k, "fp", receipts.WaitAtMost(0)))
}
