package main

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/pgstore"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

// openPGStore opens a store on a fresh schema of the test server (a service's
// node); it is closed when t ends.
func openPGStore(t *testing.T, dsn, schema string, opts receipts.Options) *receipts.DB {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	opts.GCInterval = -1
	db, err := pgstore.Open(ctx, pool, &pgstore.Options{Options: opts, Schema: schema})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		require.NoError(t, db.Close())
		pool.Close()
	})
	return db
}

// newPGFixture writes the fixture's records (see newFixture) through pgstore
// into a fresh schema and returns the receiptctl flags that name it. The
// service's node stays open while the test runs receiptctl next to it.
func newPGFixture(t *testing.T, opts receipts.Options) []string {
	t.Helper()
	dsn, schema := pgtest.Schema(t)
	fillFixture(t, openPGStore(t, dsn, schema, opts))
	return []string{"--pg", dsn, "--schema", schema}
}

// pgArgs appends args to the store flags.
func pgArgs(store []string, args ...string) []string {
	return append(append([]string{}, store...), args...)
}

func TestPGCommands(t *testing.T) {
	st := newPGFixture(t, receipts.Options{})

	// ls: the table and the JSON, with filters.
	r := cli(t, pgArgs(st, "ls")...).requireCode(t, exitOK)
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	require.Len(t, lines, 7, r.out)
	require.Regexp(t, `^SCOPE\s+ID\s+STATE\s+ATTEMPTS\s+UPDATED\s+LEASE\s+RESULT$`, lines[0])
	require.Contains(t, r.out, "failed")
	require.ElementsMatch(t, []string{"op-ok", "op-bin", "op-failed", "op-lost", "op-live", "tab\tid"}, lsIDs(t, st...))
	require.ElementsMatch(t, []string{"op-lost"}, lsIDs(t, pgArgs(st, "--abandoned")...))
	require.ElementsMatch(t, []string{"op-ok", "op-bin", "op-failed"}, lsIDs(t, pgArgs(st, "--scope", "acct_1")...))
	require.ElementsMatch(t, []string{"op-failed"}, lsIDs(t, pgArgs(st, "--state", "failed")...))

	// get: text, JSON, not found.
	r = cli(t, pgArgs(st, "get", "acct_1", "op-ok")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "state          succeeded\n")
	require.Contains(t, r.out, "result         ok:1\n")
	require.Contains(t, r.out, "fingerprint    66696e6765727072696e74\n")
	r = cli(t, pgArgs(st, "get", "acct_2", "op-lost")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "state          pending (abandoned")
	r = cli(t, pgArgs(st, "--json", "get", "acct_1", "op-bin")...).requireCode(t, exitOK)
	var a receiptadmin.Receipt
	require.NoError(t, json.Unmarshal([]byte(r.out), &a))
	require.Equal(t, []byte{0, 1, 2, 0xff}, a.Result)
	require.Equal(t, receipts.Key{Scope: "acct_1", ID: "op-bin"}, a.Key())
	r = cli(t, pgArgs(st, "get", "acct_1", "nope")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, `no record of "acct_1"/"nope"`)

	// stats: what the schema records, counts by state.
	r = cli(t, pgArgs(st, "stats", "--json")...).requireCode(t, exitOK)
	var s receiptadmin.Stats
	require.NoError(t, json.Unmarshal([]byte(r.out), &s), r.out)
	require.Equal(t, "24h0m0s", s.Retention)
	require.Equal(t, "30s", s.LeaseTTL)
	require.Equal(t, [5]int64{3, 1, 2, 1, 0}, [5]int64{s.Succeeded, s.Failed, s.Pending, s.Abandoned, s.Expired})
	r = cli(t, pgArgs(st, "stats")...).requireCode(t, exitOK)
	require.Regexp(t, `(?m)^retention\s+24h0m0s \(recorded in the store\)$`, r.out)
	require.Regexp(t, `(?m)^succeeded\s+3$`, r.out)

	// export: one receipt a line.
	r = cli(t, pgArgs(st, "export")...).requireCode(t, exitOK)
	sc := bufio.NewScanner(strings.NewReader(r.out))
	n := 0
	for sc.Scan() {
		var a receiptadmin.Receipt
		require.NoError(t, json.Unmarshal(sc.Bytes(), &a), sc.Text())
		n++
	}
	require.Equal(t, 6, n)
	r = cli(t, pgArgs(st, "export", "--state", "failed")...).requireCode(t, exitOK)
	require.Equal(t, 1, strings.Count(r.out, "\n"))
	require.Contains(t, r.out, `"state":"failed"`)

	// verify reads every record back.
	r = cli(t, pgArgs(st, "verify", "--json")...).requireCode(t, exitOK)
	var v verifyReport
	require.NoError(t, json.Unmarshal([]byte(r.out), &v), r.out)
	require.True(t, v.OK)
	require.Equal(t, 6, v.Records)
	require.Empty(t, v.Problems)
	r = cli(t, pgArgs(st, "verify")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "ok: 6 records")

	// gc: nothing is past retention.
	r = cli(t, pgArgs(st, "gc", "--json")...).requireCode(t, exitOK)
	var g receiptadmin.GCStats
	require.NoError(t, json.Unmarshal([]byte(r.out), &g), r.out)
	require.Zero(t, g.EpochsDropped)
	require.ElementsMatch(t, []string{"op-ok", "op-bin", "op-failed", "op-lost", "op-live", "tab\tid"}, lsIDs(t, st...))
}

// TestPGGCDropsExpired: records a service wrote 3 days ago with a 1h
// retention are expired; stats counts them, gc drops their partitions, and
// then nothing is left. --retention is checked against what the schema
// records; --override-retention is gc's only.
func TestPGGCDropsExpired(t *testing.T) {
	then := time.Now().Add(-72 * time.Hour)
	st := newPGFixture(t, receipts.Options{Retention: time.Hour, LeaseTTL: time.Minute, Now: func() time.Time { return then }})

	r := cli(t, pgArgs(st, "stats", "--json")...).requireCode(t, exitOK)
	var s receiptadmin.Stats
	require.NoError(t, json.Unmarshal([]byte(r.out), &s), r.out)
	require.Equal(t, "1h0m0s", s.Retention)
	require.Equal(t, int64(6), s.Expired, r.out)
	require.Empty(t, lsIDs(t, st...))

	r = cli(t, pgArgs(st, "ls", "--retention", "2h")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "records retention 1h0m0s, not 2h0m0s")
	cli(t, pgArgs(st, "ls", "--override-retention", "1000h")...).requireCode(t, exitUsage)

	r = cli(t, pgArgs(st, "gc", "--retention", "1h", "--json")...).requireCode(t, exitOK)
	var g receiptadmin.GCStats
	require.NoError(t, json.Unmarshal([]byte(r.out), &g), r.out)
	require.Positive(t, g.EpochsDropped, r.out)
	r = cli(t, pgArgs(st, "stats", "--json")...).requireCode(t, exitOK)
	require.NoError(t, json.Unmarshal([]byte(r.out), &s), r.out)
	require.Zero(t, s.Expired+s.Succeeded+s.Failed+s.Pending, r.out)
}

// TestPGUsage: receiptctl never creates a store where there was none, and
// refuses flags that do not go together.
func TestPGUsage(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	r := cli(t, "--pg", dsn, "--schema", schema, "ls").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "no store in schema")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	ok, err := hasPGStore(ctx, pool, schema)
	require.NoError(t, err)
	require.False(t, ok, "ls created a store")

	cli(t, "--pg", dsn, "--dir", t.TempDir(), "ls").requireCode(t, exitUsage)
	cli(t, "--pg", dsn, "--addr", "http://127.0.0.1:1", "stats").requireCode(t, exitUsage)
	cli(t, "--pg", dsn, "gc", "--compact").requireCode(t, exitUsage)
	cli(t, "--pg", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2", "ls").requireCode(t, exitProblem)
	r = cli(t, "gc").requireCode(t, exitUsage)
	require.Contains(t, r.stderr, "--dir DIR or --pg DSN")
}

// TestPGOverrideRetention: a service with a 7-day retention wrote receipts 3
// days ago; gc --override-retention 1h drops them (warned) and records 1h as
// the schema's retention, as on a directory.
func TestPGOverrideRetention(t *testing.T) {
	then := time.Now().Add(-72 * time.Hour)
	st := newPGFixture(t, receipts.Options{Retention: 7 * 24 * time.Hour, LeaseTTL: time.Minute, Now: func() time.Time { return then }})
	require.Len(t, lsIDs(t, st...), 6)
	r := cli(t, pgArgs(st, "gc", "--override-retention", "1h")...).requireCode(t, exitOK)
	require.Contains(t, r.stderr, "WARNING: using retention 1h0m0s (--override-retention) instead of the store's recorded 168h0m0s")
	require.NotContains(t, r.out, "dropped 0 epochs")
	require.Empty(t, lsIDs(t, st...))
	r = cli(t, pgArgs(st, "stats", "--json")...).requireCode(t, exitOK)
	var s receiptadmin.Stats
	require.NoError(t, json.Unmarshal([]byte(r.out), &s), r.out)
	require.Equal(t, "1h0m0s", s.Retention)
}

// TestPGGCLeaseHeld: pgstore runs GC one node at a time, under a maintenance
// lease that its holder keeps for a while after its pass. A gc that finds it
// held does nothing, and says so (exit 1) instead of reporting 0 dropped.
func TestPGGCLeaseHeld(t *testing.T) {
	st := newPGFixture(t, receipts.Options{})
	r := cli(t, pgArgs(st, "gc")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "dropped 0 epochs")
	r = cli(t, pgArgs(st, "gc")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "gc did nothing: another node holds the schema's maintenance lease until")
	require.Empty(t, r.out)
}

// TestPGTombstones: on PostgreSQL too, a receipt past retention within its
// tombstone window is explained by get and listed by ls --tombstones with the
// time it has left.
func TestPGTombstones(t *testing.T) {
	then := time.Now().Add(-2 * time.Hour)
	dsn, schema := pgtest.Schema(t)
	db := openPGStore(t, dsn, schema, receipts.Options{Retention: time.Hour, LeaseTTL: time.Minute,
		TombstoneWindow: 3 * time.Hour, Now: func() time.Time { return then }})
	k := receipts.Key{Scope: "acct_1", ID: "op-old"}
	_, err := db.Do(context.Background(), k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("x"), nil })
	require.NoError(t, err)
	st := []string{"--pg", dsn, "--schema", schema}

	r := cli(t, pgArgs(st, "get", "acct_1", "op-old")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, `no record of "acct_1"/"op-old": a tombstone`)
	r = cli(t, pgArgs(st, "ls", "--tombstones", "--json")...).requireCode(t, exitOK)
	var out struct {
		Tombstones []tombstoneJSON `json:"tombstones"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &out))
	require.Len(t, out.Tombstones, 1, r.out)
	require.Equal(t, "op-old", out.Tombstones[0].ID)
	left, err := time.ParseDuration(out.Tombstones[0].Left)
	require.NoError(t, err)
	require.InDelta(t, float64(2*time.Hour), float64(left), float64(time.Minute), "left: %s", left)
	r = cli(t, pgArgs(st, "ls", "--tombstones")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "MARKED USED UNTIL")
}
