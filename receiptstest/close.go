package receiptstest

import (
	"context"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var closeTests = []test{
	{"UseAfterClose", testUseAfterClose},
	{"CloseWaitsForInFlightDo", testCloseWaitsForDo},
}

// After Close every method returns ErrClosed (leases from before included);
// a second Close returns nil; nothing was half-written.
func testUseAfterClose(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	done := e.commit(key("a", "done"), "fp", "kept")
	l := e.claim(k, "fp")
	require.NoError(t, e.db.Close())
	require.NoError(t, e.db.Close(), "a second Close returns nil")

	_, _, err := e.db.Claim(bg, k, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, _, err = e.db.Claim(bg, key("a", "new"), []byte("fp"), receipts.WaitForResult())
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = e.db.Do(bg, k, []byte("fp"), nil)
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = e.db.Lookup(bg, done.Key)
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = e.db.GC(bg)
	require.ErrorIs(t, err, receipts.ErrClosed)
	n := 0
	for _, err := range e.db.Scan(bg, receipts.Filter{}) {
		require.ErrorIs(t, err, receipts.ErrClosed)
		n++
	}
	require.Equal(t, 1, n, "Scan yields ErrClosed once")
	_, err = l.Commit(bg, nil)
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = l.Fail(bg, nil)
	require.ErrorIs(t, err, receipts.ErrClosed)
	require.ErrorIs(t, l.Renew(bg), receipts.ErrClosed)
	require.ErrorIs(t, l.Release(bg), receipts.ErrClosed)
	require.ErrorIs(t, l.Abandon(bg), receipts.ErrClosed)

	e.reopen()
	sameReceipt(t, done, e.lookup(done.Key))
	r := e.visible(k, receipts.Pending)
	require.Equal(t, l.Token(), r.Token, "the claim is as it was")
}

// Close waits for an in-flight Do, whose commit lands; a waiter on the same
// key is told the store is closing.
func testCloseWaitsForDo(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	started, finish := make(chan struct{}), make(chan struct{})
	doDone := make(chan result, 1)
	go func() {
		r, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			close(started)
			<-finish
			return []byte("landed"), nil
		})
		doDone <- result{r: r, err: err}
	}()
	recv(t, started, "fn to start")
	waiterErr := make(chan error, 1)
	go func() {
		_, err := e.db.Do(bg, k, []byte("fp"), mustNotRun(t))
		waiterErr <- err
	}()
	letWaitersWait()
	closed := make(chan error, 1)
	go func() { closed <- e.db.Close() }()
	require.ErrorIs(t, recv(t, waiterErr, "the waiter"), receipts.ErrClosed)
	select {
	case <-closed:
		t.Fatal("Close returned while Do was in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(finish)
	require.NoError(t, recv(t, closed, "Close"))
	o := recv(t, doDone, "Do")
	require.NoError(t, o.err)
	require.Equal(t, []byte("landed"), o.r.Result)

	e.reopen()
	sameReceipt(t, o.r, e.lookup(k))
}
