package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// TestTombstones: a receipt written 2h ago with a 1h retention is past
// retention, within its 3h tombstone window: get explains the tombstone
// (exit 1: no record), ls --tombstones lists it with the time left.
func TestTombstones(t *testing.T) {
	then := time.Now().Add(-2 * time.Hour)
	dir := t.TempDir()
	db, err := receipts.Open(dir, &receipts.Options{Retention: time.Hour, LeaseTTL: time.Minute, TombstoneWindow: 3 * time.Hour,
		GCInterval: -1, Now: func() time.Time { return then }})
	require.NoError(t, err)
	k := receipts.Key{Scope: "acct_1", ID: "op-old"}
	_, err = db.Do(context.Background(), k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("x"), nil })
	require.NoError(t, err)
	require.NoError(t, db.Close())

	r := cli(t, "--dir", dir, "get", "acct_1", "op-old").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, `no record of "acct_1"/"op-old": a tombstone`)
	require.Contains(t, r.stderr, "ErrExpired until")

	r = cli(t, "--dir", dir, "ls", "--tombstones").requireCode(t, exitOK)
	require.Contains(t, r.out, "MARKED USED UNTIL")
	require.Contains(t, r.out, "op-old")
	r = cli(t, "--dir", dir, "ls", "--tombstones", "--json").requireCode(t, exitOK)
	var out struct {
		Tombstones []tombstoneJSON `json:"tombstones"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &out))
	require.Len(t, out.Tombstones, 1)
	left, err := time.ParseDuration(out.Tombstones[0].Left)
	require.NoError(t, err)
	require.InDelta(t, float64(2*time.Hour), float64(left), float64(time.Minute), "left: %s", left)
	r = cli(t, "--dir", dir, "ls", "--tombstones", "--scope", "acct_2").requireCode(t, exitOK)
	require.Contains(t, r.out, "no tombstones")
}
