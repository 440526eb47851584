package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

// TestOfflineUsesStoredRetention: a store opened by its service with a 7-day
// retention holds receipts written 3 days ago; offline ls, get, stats and gc
// see and keep them, and only --override-retention treats them otherwise.
func TestOfflineUsesStoredRetention(t *testing.T) {
	const week = 7 * 24 * time.Hour
	then := time.Now().Add(-3 * 24 * time.Hour)
	dir := newFixtureOpts(t, &receipts.Options{Retention: week, LeaseTTL: time.Minute, GCInterval: -1, Now: func() time.Time { return then }})
	all := []string{"op-bin", "op-failed", "op-ok", "op-live", "op-lost", "tab\tid"}

	require.ElementsMatch(t, all, lsIDs(t, "--dir", dir))
	r := cli(t, "--dir", dir, "get", "acct_1", "op-ok").requireCode(t, exitOK)
	require.Contains(t, r.out, "state          succeeded\n")
	r = cli(t, "--dir", dir, "stats", "--json").requireCode(t, exitOK)
	var s receiptadmin.Stats
	require.NoError(t, json.Unmarshal([]byte(r.out), &s))
	require.Equal(t, "168h0m0s", s.Retention)
	require.Equal(t, "1m0s", s.LeaseTTL)
	require.Equal(t, int64(3), s.Succeeded)
	require.Zero(t, s.Expired)
	r = cli(t, "--dir", dir, "stats").requireCode(t, exitOK)
	require.Regexp(t, `(?m)^retention\s+168h0m0s \(recorded in the store\)$`, r.out)

	// gc uses the recorded retention: nothing is dropped.
	r = cli(t, "--dir", dir, "gc").requireCode(t, exitOK)
	require.Contains(t, r.out, "dropped 0 epochs")
	cli(t, "--dir", dir, "gc", "--retention", "168h").requireCode(t, exitOK)
	// A --retention that is not the store's is refused, by every command.
	for _, args := range [][]string{{"gc", "--retention", "24h"}, {"ls", "--retention", "24h"}, {"get", "acct_1", "op-ok", "--retention", "24h"}} {
		r = cli(t, append([]string{"--dir", dir}, args...)...).requireCode(t, exitProblem)
		require.Contains(t, r.stderr, "the store records retention 168h0m0s, not 24h0m0s", args)
		require.Contains(t, r.stderr, "--override-retention 24h0m0s", args)
	}
	require.ElementsMatch(t, all, lsIDs(t, "--dir", dir))

	// --override-retention is heard, and warned about.
	r = cli(t, "--dir", dir, "ls", "--json", "--override-retention", "24h").requireCode(t, exitOK)
	require.Contains(t, r.stderr, "WARNING: using retention 24h0m0s (--override-retention) instead of the store's recorded 168h0m0s")
	var l receiptadmin.List
	require.NoError(t, json.Unmarshal([]byte(r.out), &l))
	require.Empty(t, l.Receipts)
	require.ElementsMatch(t, all, lsIDs(t, "--dir", dir)) // a read-only override records nothing

	// The service reopens with other values: they are recorded.
	db, err := receipts.Open(dir, &receipts.Options{Retention: 48 * time.Hour, LeaseTTL: 2 * time.Minute, GCInterval: -1})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.Empty(t, lsIDs(t, "--dir", dir)) // 3 days old: past 48h
	r = cli(t, "--dir", dir, "stats", "--json").requireCode(t, exitOK)
	require.NoError(t, json.Unmarshal([]byte(r.out), &s))
	require.Equal(t, "48h0m0s", s.Retention)
	require.Equal(t, "2m0s", s.LeaseTTL)
	require.Equal(t, int64(6), s.Expired)
	require.ElementsMatch(t, all, lsIDs(t, "--dir", dir, "--override-retention", "168h"))
}

// TestOfflineFormat1Store: a store written by a version that recorded no
// retention is read with the default (or --retention), and gc refuses to
// guess: it needs --retention, which it then records.
func TestOfflineFormat1Store(t *testing.T) {
	then := time.Now().Add(-48 * time.Hour)
	dir := newFixtureOpts(t, &receipts.Options{Retention: 72 * time.Hour, GCInterval: -1, Now: func() time.Time { return then }})
	db, err := receipts.Open(dir, &receipts.Options{Retention: 72 * time.Hour, GCInterval: -1})
	require.NoError(t, err)
	v, closer, err := pebblestore.DB(db).Get(keys.Meta)
	require.NoError(t, err)
	m, err := encoding.DecodeMeta(v)
	require.NoError(t, err)
	closer.Close()
	b, err := encoding.EncodeMeta(&encoding.Meta{Format: 1, EpochWidth: m.EpochWidth, Secret: m.Secret, CreatedAt: m.CreatedAt})
	require.NoError(t, err)
	require.NoError(t, pebblestore.DB(db).Set(keys.Meta, b, pebble.Sync))
	require.NoError(t, db.Close())

	require.Empty(t, lsIDs(t, "--dir", dir)) // the default 24h
	require.Len(t, lsIDs(t, "--dir", dir, "--retention", "72h"), 6)
	r := cli(t, "--dir", dir, "gc").requireCode(t, exitUsage)
	require.Contains(t, r.stderr, "records no retention")
	r = cli(t, "--dir", dir, "gc", "--retention", "72h").requireCode(t, exitOK)
	require.Contains(t, r.out, "dropped 0 epochs")
	require.Len(t, lsIDs(t, "--dir", dir), 6) // 72h is recorded now
	cli(t, "--dir", dir, "verify").requireCode(t, exitOK)
}
