package receipts_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// waitClosing polls until Close has begun (new calls get ErrClosed).
func waitClosing(t *testing.T, db *receipts.DB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := db.Lookup(bg, key("probe", "probe")); errors.Is(err, receipts.ErrClosed) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Close did not begin")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCloseWaitsForRun: Close waits for a Lease.Run in progress and for its
// outcome to be recorded; the receipt is there after reopening. A Claim'd
// lease that is not in Run does not hold Close up: settling it afterwards,
// or running it, returns ErrClosed and calls nothing.
func TestCloseWaitsForRun(t *testing.T) {
	s := newTestStore(t, nil)
	fp := []byte("fp")
	running := key("a", "running")
	idle := key("a", "idle")
	l, _, err := s.db.Claim(bg, running, fp)
	require.NoError(t, err)
	idleLease, _, err := s.db.Claim(bg, idle, fp)
	require.NoError(t, err)

	started, proceed := make(chan struct{}), make(chan struct{})
	ran := make(chan error, 1)
	go func() {
		_, err := l.Run(bg, func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
			close(started)
			<-proceed
			return []byte("done"), ctx.Err()
		})
		ran <- err
	}()
	<-started
	closed := make(chan error, 1)
	go func() { closed <- s.db.Close() }()
	waitClosing(t, s.db)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while Run was in progress", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(proceed)
	require.NoError(t, <-ran, "the Run in progress records its outcome during Close")
	require.NoError(t, <-closed)

	_, err = idleLease.Commit(bg, []byte("late"))
	require.ErrorIs(t, err, receipts.ErrClosed)
	_, err = idleLease.Run(bg, func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Error("Run after Close called fn")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrClosed)

	s.db = nil
	s.open()
	got, err := s.db.Lookup(bg, running)
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, got.State)
	require.Equal(t, []byte("done"), got.Result)
}

// TestRunBatchSettlesByErrorKind: RunBatch commits fn's batch with a
// Succeeded receipt and discards it for every other outcome.
func TestRunBatchSettlesByErrorKind(t *testing.T) {
	s := newTestStore(t, nil)
	fp := []byte("fp")
	run := func(id string, ferr error) (*receipts.Receipt, error) {
		l, _, err := s.db.Claim(bg, key("a", id), fp)
		require.NoError(t, err)
		return pebblestore.RunBatch(bg, l, func(_ context.Context, _ *receipts.Lease, b *pebble.Batch) ([]byte, error) {
			require.NoError(t, b.Set([]byte("app/"+id), []byte("x"), nil))
			return []byte(id), ferr
		})
	}
	has := func(id string) bool {
		_, c, err := pebblestore.DB(s.db).Get([]byte("app/" + id))
		if errors.Is(err, pebble.ErrNotFound) {
			return false
		}
		require.NoError(t, err)
		require.NoError(t, c.Close())
		return true
	}
	r, err := run("ok", nil)
	require.NoError(t, err)
	require.Equal(t, receipts.Succeeded, r.State)
	require.True(t, has("ok"))

	r, err = run("perm", receipts.Permanent(errors.New("declined")))
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, receipts.Failed, r.State)
	require.False(t, has("perm"))

	_, err = run("np", receipts.NotPerformed(errors.New("busy")))
	require.Error(t, err)
	require.NotErrorIs(t, err, receipts.ErrOutcomeUnknown)
	_, err = s.db.Lookup(bg, key("a", "np"))
	require.ErrorIs(t, err, receipts.ErrNotFound, "released")
	require.False(t, has("np"))

	_, err = run("unk", errors.New("reset"))
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	got, err := s.db.Lookup(bg, key("a", "unk"))
	require.NoError(t, err)
	require.True(t, got.Abandoned(s.clock.Now()))
	require.False(t, has("unk"))
}
