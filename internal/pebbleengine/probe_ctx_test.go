package pebbleengine

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/driver"
	"github.com/stretchr/testify/require"
)

// TestLookupHonoursCtxInEpochProbe: the epoch probe loop checks its context.
// The width is forced to 1ns behind Open's back (the root refuses it), so an
// absent key has trillions of epochs to probe: the lookup must return the
// context's error promptly. Before, the loop never looked at ctx. (Moved
// here from the root package with the read path.)
func TestLookupHonoursCtxInEpochProbe(t *testing.T) {
	now := time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)
	e, err := Open("db", Config{
		Config: driver.Config{
			Retention: time.Hour, LeaseTTL: 30 * time.Second, EpochWidth: 15 * time.Minute,
			Now: func() time.Time { return now }, Logger: slog.Default(),
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	require.NoError(t, err)
	defer e.Close()
	e.width = 1
	e.minEpoch.Store(0)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, _, err := e.Lookup(ctx, driver.Key{Scope: "a", ID: "absent"})
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("Lookup ignored its context in the epoch probe loop")
	}
}
