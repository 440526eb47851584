package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/keyring"
	"github.com/stretchr/testify/require"
)

// newKeyFile creates a key file and returns its path.
func newKeyFile(t *testing.T) (string, *keyring.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "receipts.keyring")
	kr, err := keyring.Create(path)
	require.NoError(t, err)
	return path, kr
}

// testErase runs erase on the store st names (its results encrypted under the key file kf):
// refused without --yes, then done, with the key destroyed; the scope reads as erased, the
// other one as before; erasures lists it; a second erase changes nothing.
func testErase(t *testing.T, st []string, kf string) {
	r := cli(t, pgArgs(st, "erase", "acct_1")...).requireCode(t, exitUsage)
	require.Contains(t, r.stderr, "--yes")
	cli(t, pgArgs(st, "--keyring", kf, "get", "acct_1", "op-ok")...).requireCode(t, exitOK)

	r = cli(t, pgArgs(st, "--keyring", kf, "erase", "acct_1", "--yes")...).requireCode(t, exitOK)
	require.Contains(t, r.out, `erased scope acct_1: 3 records`)
	require.Contains(t, r.out, "its key is destroyed in the key file")

	r = cli(t, pgArgs(st, "--keyring", kf, "get", "acct_1", "op-ok")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "scope erased")
	r = cli(t, pgArgs(st, "--keyring", kf, "--json", "ls")...).requireCode(t, exitOK)
	require.NotContains(t, r.out, "acct_1")
	require.Contains(t, r.out, "acct_2")
	t.Setenv(envKeyring, kf) // the key file from the environment
	cli(t, pgArgs(st, "get", "acct_2", "tab\tid")...).requireCode(t, exitOK)

	r = cli(t, pgArgs(st, "--json", "erasures", "--scope", "acct_1")...).requireCode(t, exitOK)
	var l struct{ Erasures []eraseJSON }
	require.NoError(t, json.Unmarshal([]byte(r.out), &l))
	require.Len(t, l.Erasures, 1)
	require.Equal(t, int64(3), l.Erasures[0].Records)
	require.True(t, l.Erasures[0].KeyDestroyed)
	r = cli(t, pgArgs(st, "--json", "erasures", "--scope", "acct_2")...).requireCode(t, exitOK)
	require.True(t, strings.Contains(r.out, `"erasures": []`), r.out)

	r = cli(t, pgArgs(st, "--json", "erase", "acct_1", "--yes")...).requireCode(t, exitOK)
	var again eraseJSON
	require.NoError(t, json.Unmarshal([]byte(r.out), &again))
	require.Equal(t, l.Erasures[0], again)
}

func TestErase(t *testing.T) {
	kf, kr := newKeyFile(t)
	dir := newFixtureOpts(t, &receipts.Options{GCInterval: -1, Keyring: kr})
	testErase(t, []string{"--dir", dir}, kf)
	cli(t, "--addr", "127.0.0.1:1", "erase", "acct_2", "--yes").requireCode(t, exitUsage)
}

func TestPGErase(t *testing.T) {
	kf, kr := newKeyFile(t)
	dsn, schema := pgtest.Schema(t)
	db := openPGStore(t, dsn, schema, receipts.Options{Keyring: kr})
	fillFixture(t, db)
	testErase(t, []string{"--pg", dsn, "--schema", schema}, kf)
	// The service's node sees the erasure.
	_, err := db.Lookup(context.Background(), receipts.Key{Scope: "acct_1", ID: "op-ok"})
	require.ErrorIs(t, err, receipts.ErrErased)
}
