package receipts

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/receiptstore/receipts/internal/pebbleengine"
)

// internalClock is a settable clock for the internal tests.
type internalClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *internalClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *internalClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func openInternal(t *testing.T, fs vfs.FS, clk *internalClock) *DB {
	t.Helper()
	db, err := OpenEngine(pebbleengine.Opener("db", pebbleengine.Config{Pebble: &pebble.Options{FS: fs}}),
		&Options{Retention: time.Hour, LeaseTTL: 30 * time.Second, GCInterval: -1, Now: clk.Now})
	require.NoError(t, err)
	return db
}

// until polls cond (a state another goroutine reaches), yielding between.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// TestCloseHandsOutNoLease: a claim admitted before Close began, blocked on
// the key lock (the holder's CommitWith runs its effect under it), must not
// be handed a lease once Close has begun: it gets ErrClosed. Before, the
// gate was checked only on entry, and the waiter took over the holder's
// expired claim after Close began: a synced claim of its own (Attempt 2)
// that its Commit could never finish, taken over as Recovered after the
// restart. With the effect failing (the holder's claim stays) and with it
// succeeding (the holder's commit lands).
func TestCloseHandsOutNoLease(t *testing.T) {
	for _, effectFails := range []bool{true, false} {
		name := map[bool]string{true: "holder keeps its claim", false: "holder's commit lands"}[effectFails]
		t.Run(name, func(t *testing.T) {
			fs := vfs.NewMem()
			clk := &internalClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
			db := openInternal(t, fs, clk)
			k, fp := Key{Scope: "a", ID: "k"}, []byte("fp")
			h, _, err := db.Claim(context.Background(), k, fp)
			require.NoError(t, err)
			clk.Advance(time.Minute) // the holder's lease has run out; nobody took over

			inEffect, proceed := make(chan struct{}), make(chan struct{})
			holderDone := make(chan error, 1)
			go func() {
				// pebblestore.CommitWith's path (the package imports this one).
				u := &pebbleengine.Unit{Effect: func(*pebble.Batch) error {
					close(inEffect)
					<-proceed
					if effectFails {
						return errors.New("effect failed")
					}
					return nil
				}}
				u.Bind(h.Token())
				_, err := h.Commit(pebbleengine.WithUnit(context.Background(), u), []byte("paid"))
				holderDone <- err
			}()
			<-inEffect // the holder holds the key lock

			type answer struct {
				l   *Lease
				r   *Receipt
				err error
			}
			waiter := make(chan answer, 1)
			go func() {
				l, r, err := db.Claim(context.Background(), k, fp, WaitForResult())
				waiter <- answer{l, r, err}
			}()
			until(t, "the waiter to enter", func() bool { return db.hot.Gate.Load() == 2 })
			closed := make(chan error, 1)
			go func() { closed <- db.Close() }()
			until(t, "Close to begin", func() bool { return db.hot.Gate.Load()&gateClosed != 0 })

			close(proceed)
			herr := <-holderDone
			a := <-waiter
			require.NoError(t, <-closed)
			if effectFails {
				require.Error(t, herr)
			} else {
				require.NoError(t, herr, "the in-flight holder's commit lands")
			}
			require.ErrorIs(t, a.err, ErrClosed, "a lease or receipt after Close began: %+v %+v", a.l, a.r)
			require.Nil(t, a.l)

			db = openInternal(t, fs, clk)
			defer db.Close()
			r, err := db.Lookup(context.Background(), k)
			require.NoError(t, err)
			require.Equal(t, uint32(1), r.Attempts, "the waiter left a claim of its own")
			require.Equal(t, h.Token(), r.Token)
			if effectFails {
				require.Equal(t, Pending, r.State)
			} else {
				require.Equal(t, Succeeded, r.State)
				require.Equal(t, "paid", string(r.Result))
			}
		})
	}
}

// TestCloseWaiterOfDoHolder: a holder running in Do, a waiter blocked on
// it, Close concurrently: the waiter gets ErrClosed, Close waits for the
// holder, whose commit lands; after a restart the key holds the holder's
// receipt, no claim of the waiter's.
func TestCloseWaiterOfDoHolder(t *testing.T) {
	fs := vfs.NewMem()
	clk := &internalClock{t: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)}
	db := openInternal(t, fs, clk)
	k, fp := Key{Scope: "a", ID: "k"}, []byte("fp")
	running, finish := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := db.Do(context.Background(), k, fp, func(context.Context, *Lease) ([]byte, error) {
			close(running)
			<-finish
			return []byte("paid"), nil
		})
		holder <- err
	}()
	<-running
	waiter := make(chan error, 1)
	go func() {
		_, _, err := db.Claim(context.Background(), k, fp, WaitForResult())
		waiter <- err
	}()
	until(t, "the waiter to wait", func() bool { return db.hot.Conflicts.Load() == 1 })
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	require.ErrorIs(t, <-waiter, ErrClosed)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the in-flight Do finished", err)
	default:
	}
	close(finish)
	require.NoError(t, <-holder)
	require.NoError(t, <-closed)

	db = openInternal(t, fs, clk)
	defer db.Close()
	r, err := db.Lookup(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, Succeeded, r.State)
	require.Equal(t, uint32(1), r.Attempts)
}
