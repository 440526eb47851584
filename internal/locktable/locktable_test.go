package locktable

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMutualExclusion: many goroutines locking one key are inside the
// critical section one at a time, and every one gets in.
func TestMutualExclusion(t *testing.T) {
	tab := New()
	const workers, rounds = 8, 200
	var inside, overlaps atomic.Int32
	counter := 0 // unsynchronized on purpose: -race reports a broken lock
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				e, err := tab.Lock(context.Background(), []byte("k"))
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				counter++
				runtime.Gosched() // widen the window for another goroutine to get in
				inside.Add(-1)
				e.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, overlaps.Load())
	require.Equal(t, workers*rounds, counter)
	require.Zero(t, tab.Len(), "every entry is freed once nobody references it")
}

// TestKeysIndependent: a held key blocks neither other keys nor keys that
// share its shard, and the table keeps no reference to the caller's slice.
func TestKeysIndependent(t *testing.T) {
	tab := New()
	buf := []byte("a")
	held, err := tab.Lock(context.Background(), buf)
	require.NoError(t, err)
	buf[0] = 'b' // the caller may reuse its buffer
	for _, k := range []string{"b", "c", "aa", ""} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		e, err := tab.Lock(ctx, []byte(k))
		cancel()
		require.NoError(t, err, "key %q", k)
		e.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = tab.Lock(ctx, []byte("a"))
	require.ErrorIs(t, err, context.DeadlineExceeded, "key a is still held under its own name")
	held.Unlock()
	require.Zero(t, tab.Len())
}

// TestLockHonoursContext: a waiter whose context ends gets ctx's error,
// does not get the lock, and leaves no reference behind; the holder's
// Unlock then lets the next locker in.
func TestLockHonoursContext(t *testing.T) {
	tab := New()
	held, err := tab.Lock(context.Background(), []byte("k"))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		e, err := tab.Lock(ctx, []byte("k"))
		if err == nil {
			e.Unlock()
			err = errors.New("locked a held key")
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Lock returned while the key was held: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	cancel()
	require.ErrorIs(t, <-got, context.Canceled)
	require.Equal(t, 1, tab.Len(), "only the holder's entry remains")

	// An ended context with the lock free: Lock still succeeds (the free
	// lock is taken before the context is looked at).
	other, err := tab.Lock(ctx, []byte("other"))
	require.NoError(t, err)
	other.Unlock()

	held.Unlock()
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	e, err := tab.Lock(ctx2, []byte("k"))
	require.NoError(t, err)
	e.Unlock()
}

// TestWaiterGetsLockOnUnlock: a blocked locker gets the key as soon as the
// holder unlocks it.
func TestWaiterGetsLockOnUnlock(t *testing.T) {
	tab := New()
	held, err := tab.Lock(context.Background(), []byte("k"))
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e, err := tab.Lock(ctx, []byte("k"))
		if err == nil {
			e.Unlock()
		}
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	held.Unlock()
	require.NoError(t, <-got)
	require.Zero(t, tab.Len())
}

// TestWatchNotify: a watch taken under the lock fires at the key's next
// Notify and not before, every watcher fires, a watch taken after a Notify
// waits for the one after that, and a watch keeps the entry alive until Done.
func TestWatchNotify(t *testing.T) {
	tab := New()
	ctx := context.Background()
	e, err := tab.Lock(ctx, []byte("k"))
	require.NoError(t, err)
	w1, w2 := tab.Watch([]byte("k")), tab.Watch([]byte("k"))
	e.Unlock()
	require.Equal(t, 1, tab.Len(), "the watches keep the entry")
	select {
	case <-w1.C:
		t.Fatal("watch fired before Notify")
	default:
	}

	// A Notify on another key wakes nobody here.
	o, err := tab.Lock(ctx, []byte("other"))
	require.NoError(t, err)
	o.Notify()
	o.Unlock()

	e, err = tab.Lock(ctx, []byte("k"))
	require.NoError(t, err)
	e.Notify()
	w3 := tab.Watch([]byte("k")) // after the Notify: waits for the next one
	e.Unlock()
	for _, w := range []Watch{w1, w2} {
		select {
		case <-w.C:
		case <-time.After(time.Second):
			t.Fatal("watch did not fire at Notify")
		}
		w.Done()
	}
	select {
	case <-w3.C:
		t.Fatal("a watch taken after Notify fired on it")
	default:
	}
	require.Equal(t, 1, tab.Len())
	w3.Done()
	require.Zero(t, tab.Len(), "Done releases the entry")

	// A recycled entry starts with a fresh, unfired channel.
	e, err = tab.Lock(ctx, []byte("k2"))
	require.NoError(t, err)
	w := tab.Watch([]byte("k2"))
	e.Unlock()
	select {
	case <-w.C:
		t.Fatal("a recycled entry's watch fired without Notify")
	default:
	}
	w.Done()
}

// TestWatchWithoutLock: Table.Watch needs no key lock, and a watch taken
// while another holds the lock fires at that holder's Notify.
func TestWatchWithoutLock(t *testing.T) {
	tab := New()
	ctx := context.Background()
	e, err := tab.Lock(ctx, []byte("k"))
	require.NoError(t, err)
	w := tab.Watch([]byte("k")) // the lock is held by e: Watch does not wait for it
	e.Notify()
	e.Unlock()
	select {
	case <-w.C:
	case <-time.After(time.Second):
		t.Fatal("watch did not fire at Notify")
	}
	w.Done()
	require.Zero(t, tab.Len())
}

// TestRecycledEntryKeys: an entry reused from the free pool for another
// key (shorter, then longer) is found under that key only, and the key it
// held before is a different entry.
func TestRecycledEntryKeys(t *testing.T) {
	tab := New()
	ctx := context.Background()
	keys := [][]byte{[]byte("a-rather-long-key-of-the-first-entry"), []byte("b"), []byte("c-longer-than-b")}
	for _, k := range keys {
		e, err := tab.Lock(ctx, k)
		require.NoError(t, err)
		w := tab.Watch(k)
		require.Same(t, e, w.e, "Watch of %q finds the locked entry", k)
		for _, o := range keys {
			if string(o) == string(k) {
				continue
			}
			lctx, cancel := context.WithTimeout(ctx, time.Second)
			oe, err := tab.Lock(lctx, o) // another key: not held, so no wait
			cancel()
			require.NoError(t, err, "%q while %q is held", o, k)
			require.NotSame(t, e, oe)
			oe.Unlock()
		}
		w.Done()
		e.Unlock()
		require.Zero(t, tab.Len())
	}
}

// TestNoAllocs: locking, notifying and unlocking a key whose entry comes
// from the free pool allocates nothing when nobody watches.
func TestNoAllocs(t *testing.T) {
	tab := New()
	ctx := context.Background()
	k := []byte("scope/some-operation-key")
	n := testing.AllocsPerRun(1000, func() {
		e, err := tab.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		e.Notify()
		e.Unlock()
	})
	require.Zero(t, n)
}
