package main

import (
	"bufio"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

func TestGet(t *testing.T) {
	dir := newFixture(t)

	r := cli(t, "--dir", dir, "get", "acct_1", "op-ok").requireCode(t, exitOK)
	require.Contains(t, r.out, "state          succeeded\n")
	require.Contains(t, r.out, "result         ok:1\n")
	require.Contains(t, r.out, "fingerprint    66696e6765727072696e74\n")

	// --dir after the command name; a binary result is base64.
	r = cli(t, "get", "acct_1", "op-bin", "--dir", dir).requireCode(t, exitOK)
	require.Contains(t, r.out, "result         base64:AAEC/w==\n")

	// A key part that is not printable is quoted; a printable multi-line
	// result is shown as text.
	r = cli(t, "--dir", dir, "get", "acct_2", "tab\tid").requireCode(t, exitOK)
	require.Contains(t, r.out, "id             \"tab\\tid\"\n")
	require.Contains(t, r.out, "result         multi\n               line\n")

	r = cli(t, "--dir", dir, "get", "acct_2", "op-lost").requireCode(t, exitOK)
	require.Contains(t, r.out, "state          pending (abandoned")
	r = cli(t, "--dir", dir, "get", "acct_2", "op-live").requireCode(t, exitOK)
	require.Contains(t, r.out, "state          pending (lease live")

	r = cli(t, "--dir", dir, "--json", "get", "acct_1", "op-bin").requireCode(t, exitOK)
	var a receiptadmin.Receipt
	require.NoError(t, json.Unmarshal([]byte(r.out), &a))
	require.Equal(t, []byte{0, 1, 2, 0xff}, a.Result)
	require.Equal(t, "succeeded", a.State)
	require.Equal(t, receipts.Key{Scope: "acct_1", ID: "op-bin"}, a.Key())

	r = cli(t, "--dir", dir, "get", "acct_1", "nope").requireCode(t, exitProblem)
	require.Empty(t, r.out)
	require.Contains(t, r.stderr, `no record of "acct_1"/"nope"`)

	cli(t, "--dir", dir, "get", "acct_1").requireCode(t, exitUsage)
	cli(t, "--dir", dir, "get", "", "x").requireCode(t, exitUsage)
}

// lsIDs returns the IDs that ls --json lists with args.
func lsIDs(t *testing.T, args ...string) []string {
	t.Helper()
	r := cli(t, append([]string{"ls", "--json"}, args...)...).requireCode(t, exitOK)
	var l receiptadmin.List
	require.NoError(t, json.Unmarshal([]byte(r.out), &l), r.out)
	require.Empty(t, l.Errors)
	require.False(t, l.Now.IsZero())
	ids := []string{}
	for _, a := range l.Receipts {
		ids = append(ids, a.Key().ID)
	}
	return ids
}

func TestLs(t *testing.T) {
	dir := newFixture(t)
	r := cli(t, "--dir", dir, "ls").requireCode(t, exitOK)
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	require.Len(t, lines, 7, r.out)
	require.Regexp(t, `^SCOPE\s+ID\s+STATE\s+ATTEMPTS\s+UPDATED\s+LEASE\s+RESULT$`, lines[0])
	// Aligned: every row's ID column starts where the header's does.
	col := strings.Index(lines[0], "ID")
	for _, l := range lines[1:] {
		require.Equal(t, "acct_", l[:5])
		require.NotEqual(t, ' ', l[col], l)
		require.Equal(t, ' ', rune(l[col-1]), l)
	}
	require.Contains(t, r.out, "base64:AAEC/w==")
	require.Contains(t, r.out, `"tab\tid"`)
	require.Regexp(t, `op-lost\s+pending \(abandoned\)\s+1\s+.*expired`, r.out)
	require.Regexp(t, `op-live\s+pending\s+1\s+.*live `, r.out)
	require.NotContains(t, r.out, "\x00")

	all := []string{"op-bin", "op-failed", "op-ok", "op-live", "op-lost", "tab\tid"}
	require.ElementsMatch(t, all, lsIDs(t, "--dir", dir))
	require.ElementsMatch(t, []string{"op-bin", "op-failed", "op-ok"}, lsIDs(t, "--dir", dir, "--scope", "acct_1"))
	require.ElementsMatch(t, []string{"op-live", "op-lost"}, lsIDs(t, "--dir", dir, "--state", "pending"))
	require.ElementsMatch(t, []string{"op-lost"}, lsIDs(t, "--dir", dir, "--abandoned"))
	require.ElementsMatch(t, []string{"op-failed"}, lsIDs(t, "--state", "failed", "--dir", dir))
	require.Len(t, lsIDs(t, "--dir", dir, "--limit", "2"), 2)
	require.Empty(t, lsIDs(t, "--dir", dir, "--scope", "nobody"))

	r = cli(t, "--dir", dir, "ls", "--scope", "nobody").requireCode(t, exitOK)
	require.Equal(t, "no records match\n", r.out)

	cli(t, "--dir", dir, "ls", "--state", "done").requireCode(t, exitUsage)
	cli(t, "--dir", dir, "ls", "--limit", "-1").requireCode(t, exitUsage)
	cli(t, "--dir", dir, "ls", "extra").requireCode(t, exitUsage)
}

func TestStats(t *testing.T) {
	dir := newFixture(t)
	r := cli(t, "--dir", dir, "stats").requireCode(t, exitOK)
	require.Regexp(t, `(?m)^succeeded\s+3$`, r.out)
	require.Regexp(t, `(?m)^pending\s+2\s+\(abandoned 1\)$`, r.out)
	require.Regexp(t, `(?m)^failed\s+1$`, r.out)
	require.Regexp(t, `(?m)^retention\s+24h0m0s \(recorded in the store\)$`, r.out)

	r = cli(t, "stats", "--json", "--dir", dir, "--override-retention", "48h").requireCode(t, exitOK)
	var s receiptadmin.Stats
	require.NoError(t, json.Unmarshal([]byte(r.out), &s))
	require.Equal(t, int64(3), s.Succeeded)
	require.Equal(t, int64(2), s.Pending)
	require.Equal(t, int64(1), s.Abandoned)
	require.Equal(t, int64(1), s.Failed)
	require.Equal(t, "48h0m0s", s.Retention)
	require.Empty(t, s.LeaseTTL) // receiptctl's own under --override-retention
	require.Equal(t, 1, s.LiveEpochs)
	require.NotZero(t, s.DiskBytes)
}

func TestExport(t *testing.T) {
	dir := newFixture(t)
	r := cli(t, "--dir", dir, "export").requireCode(t, exitOK)
	sc := bufio.NewScanner(strings.NewReader(r.out))
	got := map[string]receiptadmin.Receipt{}
	for sc.Scan() {
		var a receiptadmin.Receipt
		require.NoError(t, json.Unmarshal(sc.Bytes(), &a), sc.Text())
		got[a.Key().ID] = a
	}
	require.Len(t, got, 6)
	require.Equal(t, []byte{0, 1, 2, 0xff}, got["op-bin"].Result)
	require.Equal(t, []byte("multi\nline"), got["tab\tid"].Result)
	require.Contains(t, r.out, `"result":"AAEC/w=="`) // base64
	require.Equal(t, "failed", got["op-failed"].State)
	require.True(t, got["op-lost"].Abandoned)

	r = cli(t, "--dir", dir, "export", "--state", "failed").requireCode(t, exitOK)
	require.Equal(t, 1, strings.Count(r.out, "\n"))
}

func TestGC(t *testing.T) {
	// The records were written two days ago (a fixed clock, in the middle
	// of a 6h epoch).
	then := time.Now().Add(-48 * time.Hour).Truncate(6 * time.Hour).Add(time.Hour)
	dir := newFixtureOpts(t, &receipts.Options{GCInterval: -1, Now: func() time.Time { return then }})

	// Past the store's 24h retention they are invisible, waiting for GC.
	require.Empty(t, lsIDs(t, "--dir", dir))
	require.Len(t, lsIDs(t, "--dir", dir, "--override-retention", "72h"), 6)
	r := cli(t, "--dir", dir, "stats", "--json").requireCode(t, exitOK)
	var s receiptadmin.Stats
	require.NoError(t, json.Unmarshal([]byte(r.out), &s))
	require.Equal(t, int64(6), s.Expired)

	r = cli(t, "--dir", dir, "gc", "--override-retention", "72h").requireCode(t, exitOK) // records 72h
	require.Contains(t, r.out, "dropped 0 epochs")
	require.Len(t, lsIDs(t, "--dir", dir), 6)

	r = cli(t, "--dir", dir, "gc", "--override-retention", "24h", "--compact", "--json").requireCode(t, exitOK)
	var g receiptadmin.GCStats
	require.NoError(t, json.Unmarshal([]byte(r.out), &g))
	require.Equal(t, 1, g.EpochsDropped)
	require.True(t, g.Compacted)
	require.Empty(t, lsIDs(t, "--dir", dir, "--override-retention", "72h"))
	cli(t, "--dir", dir, "verify").requireCode(t, exitOK)

	cli(t, "--dir", dir, "gc", "--retention", "1ns").requireCode(t, exitUsage)
}

func TestUsage(t *testing.T) {
	dir := newFixture(t)
	for _, args := range [][]string{
		{},
		{"nope"},
		{"ls", "--bogus"},
		{"ls"}, // neither --dir nor --addr
		{"--dir", dir, "--addr", "http://x:1", "ls"},   // both
		{"--addr", "http://127.0.0.1:1", "gc"},         // offline only
		{"--addr", "http://127.0.0.1:1", "verify"},     // offline only
		{"--addr", "ftp://127.0.0.1:1", "ls"},          // not http
		{"--dir", dir, "--retention", "0s", "ls"},      // retention must be positive
		{"--dir", dir, "--retention", "soon", "stats"}, // not a duration
		{"demo-child", "--dir", dir},                   // only the demo runs it
	} {
		r := cli(t, args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", args, r.stderr)
		require.Contains(t, r.stderr, "receiptctl: ", args)
	}

	r := cli(t, "--dir", filepath.Join(dir, "missing"), "ls").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "no store at")
	r = cli(t, "--dir", t.TempDir(), "ls").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "holds no Pebble store")
}

func TestHelp(t *testing.T) {
	r := cli(t, "--help").requireCode(t, exitOK)
	for _, c := range []string{"get", "ls", "stats", "gc", "verify", "export", "demo"} {
		require.Contains(t, r.out, "\n  "+c+" ")
		h := cli(t, c, "--help").requireCode(t, exitOK)
		require.Contains(t, h.out, "Examples:\n  receiptctl", c)
		require.Contains(t, h.out, "--json", c) // global flags are listed
	}
	require.NotContains(t, r.out, "demo-child")
}

func TestLocked(t *testing.T) {
	dir := newFixture(t)
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	for _, cmd := range []string{"ls", "stats", "verify", "export"} {
		r := cli(t, "--dir", dir, cmd).requireCode(t, exitProblem)
		require.Contains(t, r.stderr, "held by a running process", cmd)
		require.Contains(t, r.stderr, "--addr", cmd)
		require.Contains(t, r.stderr, "Checkpoint", cmd)
		require.NotContains(t, r.stderr, "pebble", cmd) // not the raw lock error
	}
	r := cli(t, "--dir", dir, "gc", "--retention", "24h").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "--addr")

	// A checkpoint of the running store opens.
	cp := filepath.Join(t.TempDir(), "cp")
	require.NoError(t, pebblestore.Checkpoint(db, cp))
	require.Len(t, lsIDs(t, "--dir", cp), 6)
}

// TestNotAReceiptsStore checks that a plain Pebble store is reported, and
// left unchanged, by every command.
func TestNotAReceiptsStore(t *testing.T) {
	dir := t.TempDir()
	p, err := pebble.Open(dir, &pebble.Options{})
	require.NoError(t, err)
	require.NoError(t, p.Set([]byte("app"), []byte("data"), pebble.Sync))
	require.NoError(t, p.Close())
	for _, args := range [][]string{{"ls"}, {"stats"}, {"verify"}, {"export"}, {"get", "a", "b"}, {"gc", "--retention", "24h"}} {
		r := cli(t, append(args, "--dir", dir)...).requireCode(t, exitProblem)
		require.Contains(t, r.stderr, "is it a receipts store?", args)
	}
	p, err = pebble.Open(dir, &pebble.Options{})
	require.NoError(t, err)
	defer p.Close()
	_, closer, err := p.Get(keys.Meta)
	require.ErrorIs(t, err, pebble.ErrNotFound)
	if closer != nil {
		closer.Close()
	}
}
