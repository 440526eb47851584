package pebbleengine

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/driver"
	"github.com/stretchr/testify/require"
)

// TestClaimTimedAfterCloseBeganIsRefused (issue 12 item 5): Close begins
// exactly when a claim takes its time (the clock sets the closing gate as
// it is read). The claim was admitted before Close, but its time is later
// than Close's start: it writes nothing and answers ErrClosed. Before the
// fix the gate was read under the key lock but before the time, and this
// claim was handed out.
func TestClaimTimedAfterCloseBeganIsRefused(t *testing.T) {
	start := time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)
	var closing atomic.Bool
	var reads atomic.Int64 // clock reads left until Close begins (0: none pending)
	now := func() time.Time {
		if reads.Add(-1) == 0 {
			closing.Store(true) // Close begins as the claim reads the clock
		}
		return start
	}
	e, err := Open("db", Config{
		Config: driver.Config{
			Retention: time.Hour, LeaseTTL: 30 * time.Second, EpochWidth: 15 * time.Minute,
			Now: now, Logger: slog.Default(), Closing: closing.Load,
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	require.NoError(t, err)
	defer e.Close()
	reads.Store(1 << 40) // Open's reads
	ctx := context.Background()
	req := driver.ClaimRequest{Key: driver.Key{Scope: "a", ID: "k"}, Fingerprint: []byte("fp"), LeaseTTL: 30 * time.Second}

	// Claim reads the clock twice: for the replay cache (no lock), then in
	// rmw under the key lock, the time the claim is decided at.
	reads.Store(2)
	_, err = e.Claim(ctx, req)
	require.ErrorIs(t, err, driver.ErrClosed)
	require.True(t, closing.Load())
	closing.Store(false)
	_, found, _, err := e.Lookup(ctx, req.Key)
	require.NoError(t, err)
	require.False(t, found, "a claim timed after Close began was written")

	res, err := e.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, driver.Claimed, res.Outcome)
	require.Equal(t, uint32(1), res.Record.Attempts)
}
