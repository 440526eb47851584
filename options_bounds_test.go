package receipts_test

import (
	"context"
	"errors"
	"math"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// maxRetention is receipts.MaxRetention, spelled out so that this file
// also builds against the code from before the bounds.
const maxRetention = 100 * 365 * 24 * time.Hour

// TestOpenRefusesUnboundedDurations: every duration option outside its
// documented bound is refused with ErrInvalidOptions, and Open creates
// nothing. Before the bounds, most of these opened (a Retention near
// MaxInt64 expired every record at once; a 1ns EpochWidth made a lookup of
// an absent key probe billions of epochs).
func TestOpenRefusesUnboundedDurations(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    receipts.Options
	}{
		{"retention negative", receipts.Options{Retention: -time.Second}},
		{"retention past 100y", receipts.Options{Retention: maxRetention + time.Nanosecond}},
		{"retention MaxInt64", receipts.Options{Retention: math.MaxInt64}},
		{"leaseTTL negative", receipts.Options{LeaseTTL: -time.Second}},
		{"leaseTTL = retention", receipts.Options{Retention: time.Hour, LeaseTTL: time.Hour}},
		{"leaseTTL > retention", receipts.Options{Retention: time.Hour, LeaseTTL: 2 * time.Hour}},
		{"epochWidth negative", receipts.Options{EpochWidth: -time.Second}},
		{"epochWidth 1ns", receipts.Options{EpochWidth: time.Nanosecond}},
		{"epochWidth < retention/1024", receipts.Options{Retention: time.Hour, EpochWidth: time.Hour / 1025}},
		{"epochWidth past 100y", receipts.Options{Retention: time.Hour, EpochWidth: maxRetention + 1}},
		{"epochWidth MaxInt64", receipts.Options{EpochWidth: math.MaxInt64}},
		{"gcInterval 1ns", receipts.Options{GCInterval: time.Nanosecond}},
		{"gcInterval past 100y", receipts.Options{GCInterval: maxRetention + 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			o := tc.o
			db, err := pebblestore.Open("db", &pebblestore.Options{Options: o, Pebble: &pebble.Options{FS: fs}})
			if err == nil {
				_ = db.Close()
			}
			require.ErrorIs(t, err, receipts.ErrInvalidOptions)
			_, serr := fs.Stat("db")
			require.True(t, errors.Is(serr, os.ErrNotExist), "Open created the store's directory: %v", serr)
		})
	}
	// The bounds themselves are accepted.
	for _, o := range []receipts.Options{
		{Retention: maxRetention, LeaseTTL: maxRetention - 1},
		{Retention: time.Hour, EpochWidth: time.Hour / 1024},
		{Retention: time.Hour, EpochWidth: maxRetention},
		{GCInterval: time.Millisecond},
		{GCInterval: maxRetention, Retention: time.Nanosecond * 2, LeaseTTL: time.Nanosecond},
	} {
		db, err := pebblestore.Open("db", &pebblestore.Options{Options: o, Pebble: &pebble.Options{FS: vfs.NewMem()}})
		require.NoError(t, err, "%+v", o)
		require.NoError(t, db.Close())
	}
}

// TestOpenRefusesStoredWidthTooNarrow: the epoch width is persisted at
// creation; reopening with a Retention it cannot cover in 1024 epochs is
// refused, and the store is left as it was.
func TestOpenRefusesStoredWidthTooNarrow(t *testing.T) {
	s := newTestStore(t, nil) // Retention 1h: width 15m
	_, err := s.db.Do(bg, key("a", "k"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil })
	require.NoError(t, err)
	require.NoError(t, s.db.Close())
	s.db = nil

	o := s.opts
	o.Retention = 1025 * 15 * time.Minute
	o.Pebble = &pebble.Options{FS: s.fs}
	db, err := pebblestore.Open(s.dir, &o)
	if err == nil {
		_ = db.Close()
	}
	require.ErrorIs(t, err, receipts.ErrInvalidOptions)

	o.Retention = 1024 * 15 * time.Minute // the bound itself is fine
	db, err = pebblestore.Open(s.dir, &o)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	s.open()
	require.Equal(t, 15*time.Minute, s.db.Options().EpochWidth)
	r, err := s.db.Lookup(bg, key("a", "k"))
	require.NoError(t, err)
	require.Equal(t, "r", string(r.Result))
}

// TestLongestRetentionReplays: with the longest Retention a store accepts,
// a committed receipt is replayed and the effect runs once, also with a
// clock far in the future (the store's clock saturates). Before the
// bounds, a Retention near MaxInt64 was accepted and overflowed the expiry:
// every receipt was expired when written, and the retry ran the effect
// again.
func TestLongestRetentionReplays(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retention time.Duration
		now       time.Time
	}{
		{"max retention", maxRetention, time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)},
		{"max retention, clock in year 9999", maxRetention, time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"max retention, clock before 1970", maxRetention, time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"MaxInt64 retention", math.MaxInt64 - 1, time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := pebblestore.Open("db", &pebblestore.Options{
				Options: receipts.Options{
					Retention:  tc.retention,
					GCInterval: -1,
					Now:        func() time.Time { return tc.now },
				},
				Pebble: &pebble.Options{FS: vfs.NewMem()},
			})
			if err != nil {
				require.ErrorIs(t, err, receipts.ErrInvalidOptions, "a bad Retention is refused, or it works")
				require.Greater(t, tc.retention, maxRetention)
				return
			}
			defer db.Close()
			var effects atomic.Int32
			fn := func(context.Context, *receipts.Lease) ([]byte, error) {
				effects.Add(1)
				return []byte("paid"), nil
			}
			k := key("pay", "1")
			for range 2 {
				r, err := db.Do(bg, k, []byte("fp"), fn)
				require.NoError(t, err)
				require.Equal(t, "paid", string(r.Result))
			}
			require.Equal(t, int32(1), effects.Load(), "the retry ran the effect again")
			r, err := db.Lookup(bg, k)
			require.NoError(t, err)
			require.Equal(t, receipts.Succeeded, r.State)
		})
	}
}
