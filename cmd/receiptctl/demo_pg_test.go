package main

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// checkDemoPGReport checks what demo --pg reported and the provider's log.
func checkDemoPGReport(t *testing.T, out, dir string) demoReport {
	t.Helper()
	var rep demoReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, int64(11), rep.CallsAttempted)
	require.Equal(t, 3, rep.EffectsPerformed)
	require.Equal(t, 0, rep.DuplicateEffects)
	require.Equal(t, map[string]int64{"succeeded": 3, "failed": 0, "pending": 0}, rep.Receipts)
	effects, err := (&provider{path: filepath.Join(dir, providerLog)}).effects()
	require.NoError(t, err)
	require.Len(t, effects, 3)
	seen := map[string]bool{}
	for _, e := range effects {
		require.False(t, seen[e.IdempotencyKey], "duplicate effect %+v", e)
		seen[e.IdempotencyKey] = true
	}
	return rep
}

// TestDemoPG plays the demo on two nodes sharing one database (and a third,
// crashing node: this test binary, see TestMain), then reads the schema it
// left with receiptctl --pg.
func TestDemoPG(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	dir := filepath.Join(t.TempDir(), "demo")
	// --pg DSN: the flag's optional value given as the next argument.
	r := cli(t, "demo", "--pg", dsn, "--schema", schema, "--dir", dir, "--json").requireCode(t, exitOK)
	rep := checkDemoPGReport(t, r.out, dir)
	require.Equal(t, "receiptctl --pg "+shellQuote(dsn)+" --schema "+schema+" ls", rep.LsCommand)

	st := []string{"--pg", dsn, "--schema", schema}
	require.ElementsMatch(t, []string{"trip-1", "pay-1", "xfer-1"}, lsIDs(t, st...))
	r = cli(t, pgArgs(st, "get", demoScope, "xfer-1")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "attempts       2\n") // node C's attempt, then node B's recovery
	require.Contains(t, r.out, "result         conf-0003\n")
	cli(t, pgArgs(st, "verify")...).requireCode(t, exitOK)

	// The schema holds a store now: a second demo refuses it.
	r = cli(t, "demo", "--pg="+dsn, "--schema", schema, "--dir", t.TempDir()).requireCode(t, exitUsage)
	require.Contains(t, r.stderr, "fresh schema")
	cli(t, "demo", "extra").requireCode(t, exitUsage)
}

// TestDemoPGNoServer: --pg alone needs the server binaries for its throwaway
// cluster, and says so.
func TestDemoPGNoServer(t *testing.T) {
	t.Setenv("PG_BINDIR", "/nonexistent")
	r := cli(t, "demo", "--pg", "--dir", t.TempDir()).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "no PostgreSQL server binaries were found")
	require.Contains(t, r.stderr, "demo --pg postgres://")
}

// TestDemoPGThrowaway: --pg alone starts a throwaway cluster and removes it.
func TestDemoPGThrowaway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	if _, err := pgtest.FindBinDir(); err != nil {
		t.Skip(err)
	}
	dir := filepath.Join(t.TempDir(), "demo")
	r := cli(t, "demo", "--pg", "--dir", dir, "--json").requireCode(t, exitOK)
	rep := checkDemoPGReport(t, r.out, dir)
	require.Empty(t, rep.LsCommand)
}
