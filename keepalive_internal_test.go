package receipts

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
)

// TestKeepAliveStopWaitsForRenewal: the renewer runs from a timer. stop
// waits for a renewal under way to end, no renewal starts after stop
// returns, and a second stop is harmless. A lost lease cancels the effect
// and ends the renewals.
func TestKeepAliveStopWaitsForRenewal(t *testing.T) {
	clk := &internalClock{t: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)}
	db := openInternal(t, vfs.NewMem(), clk)
	defer db.Close()
	l, _, err := db.Claim(context.Background(), Key{Scope: "s", ID: "k"}, []byte("fp"))
	require.NoError(t, err)
	l.ttl = 3 * time.Millisecond // a renewal every millisecond

	var calls, inside atomic.Int32
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	renew := func(context.Context) error {
		inside.Add(1)
		defer inside.Add(-1)
		if calls.Add(1) == 3 {
			entered <- struct{}{}
			<-release // the third renewal is under way when stop is called
		}
		return nil
	}
	_, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop := l.keepAliveWith(cancel, false, renew).stop
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while a renewal was under way")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-stopped
	require.Zero(t, inside.Load())
	n := calls.Load()
	time.Sleep(20 * time.Millisecond) // twenty renewal periods
	require.Equal(t, n, calls.Load(), "a renewal ran after stop returned")
	stop()

	// A lost lease: the effect's context ends with ErrLeaseLost, and no
	// renewal follows.
	var lost atomic.Int32
	ctx, cancel2 := context.WithCancelCause(context.Background())
	defer cancel2(nil)
	stop = l.keepAliveWith(cancel2, false, func(context.Context) error { lost.Add(1); return ErrLeaseLost }).stop
	defer stop()
	select {
	case <-ctx.Done():
		require.True(t, errors.Is(context.Cause(ctx), ErrLeaseLost))
	case <-time.After(10 * time.Second):
		t.Fatal("the lost lease never cancelled the effect")
	}
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, int32(1), lost.Load(), "renewals went on after the lease was lost")
}

// TestRunKeeperRecycled: run's keeper, stopped before its timer fired, goes back to the
// pool (recycle) and serves the next run (runKeeper), renewing the new lease.
func TestRunKeeperRecycled(t *testing.T) {
	clk := &internalClock{t: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)}
	db := openInternal(t, vfs.NewMem(), clk)
	defer db.Close()
	claim := func(id string) *Lease {
		l, _, err := db.Claim(context.Background(), Key{Scope: "s", ID: id}, []byte("fp"))
		require.NoError(t, err)
		return l
	}
	_, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)

	l1 := claim("k1")
	k := l1.runKeeper(cancel)
	k.stop()
	require.True(t, k.idle, "stopped before its timer fired")
	k.recycle()
	require.Nil(t, k.l, "a recycled keeper keeps no lease")

	// The next run's keeper, whichever the pool gives, renews its own lease.
	l2 := claim("k2")
	l2.ttl = 3 * time.Millisecond
	var renewed atomic.Int32
	k2 := l2.runKeeper(cancel)
	k2.mu.Lock()
	require.Same(t, l2, k2.l)
	require.False(t, k2.stopped)
	k2.renew = func(context.Context) error { renewed.Add(1); return nil }
	k2.mu.Unlock()
	until(t, "a renewal of the reused keeper", func() bool { return renewed.Load() >= 2 })
	k2.stop()
	k2.recycle() // its timer fired: not pooled (renew set: not pooled either)
}
