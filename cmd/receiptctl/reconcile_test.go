package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// reconcileRows runs reconcile --json on store and decodes the list.
func reconcileRows(t *testing.T, store []string) []reconcileRow {
	t.Helper()
	r := cli(t, pgArgs(store, "reconcile", "--json")...).requireCode(t, exitOK)
	var rows []reconcileRow
	require.NoError(t, json.Unmarshal([]byte(r.out), &rows), r.out)
	return rows
}

// testReconcile lists the fixture's abandoned claim, refuses what must be
// refused (a live lease, a stale token, a settled record, two outcomes) with
// nothing written, and settles the listed attempt.
func testReconcile(t *testing.T, store []string, settle []string, after func(t *testing.T)) {
	rows := reconcileRows(t, store)
	require.Len(t, rows, 1)
	lost := rows[0]
	require.Equal(t, "acct_2", lost.Scope)
	require.Equal(t, "op-lost", lost.ID)
	require.Equal(t, uint32(1), lost.Attempts)
	require.Regexp(t, `^rk_[A-Za-z0-9_-]{43}$`, lost.ProviderKey)
	table := cli(t, pgArgs(store, "reconcile")...).requireCode(t, exitOK)
	require.Contains(t, table.out, lost.ProviderKey)
	require.Contains(t, table.out, "op-lost")
	require.NotContains(t, table.out, "op-live", "a live lease is not abandoned")

	tok := strconv.FormatUint(lost.Token, 10)
	r := cli(t, pgArgs(store, "reconcile", "acct_2", "op-live", "--commit", "x")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "lease is live")
	r = cli(t, pgArgs(store, "reconcile", "acct_2", "op-lost", "--token", strconv.FormatUint(lost.Token+1000, 10), "--commit", "x")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "is gone")
	r = cli(t, pgArgs(store, "reconcile", "acct_1", "op-ok", "--commit", "x")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "already settled")
	cli(t, pgArgs(store, "reconcile", "acct_2", "op-lost", "--commit", "x", "--fail", "y")...).requireCode(t, exitUsage)
	cli(t, pgArgs(store, "reconcile", "acct_2")...).requireCode(t, exitUsage)
	cli(t, pgArgs(store, "reconcile", "--commit", "x")...).requireCode(t, exitUsage)
	require.Equal(t, []reconcileRow{lost}, reconcileRows(t, store), "nothing written by the refused ones")

	r = cli(t, pgArgs(store, append([]string{"reconcile", "acct_2", "op-lost", "--token", tok, "--json"}, settle...)...)...).requireCode(t, exitOK)
	var res reconcileResult
	require.NoError(t, json.Unmarshal([]byte(r.out), &res), r.out)
	require.Equal(t, uint32(2), res.Attempts, "the listed attempt was taken over")
	require.Greater(t, res.Token, lost.Token)
	require.Empty(t, reconcileRows(t, store))
	after(t)
	r = cli(t, pgArgs(store, "reconcile", "acct_2", "op-lost", "--token", tok, "--commit", "again")...)
	require.Equal(t, exitProblem, r.code, "the attempt is settled: a second settle of it writes nothing")
}

func TestReconcile(t *testing.T) {
	dir := newFixture(t)
	store := []string{"--dir", dir}
	testReconcile(t, store, []string{"--commit", "charged ch_1"}, func(t *testing.T) {
		r := cli(t, pgArgs(store, "get", "acct_2", "op-lost", "--json")...).requireCode(t, exitOK)
		var got struct {
			State    string
			Result   []byte
			Attempts int
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got), r.out)
		require.Equal(t, "succeeded", got.State)
		require.Equal(t, "charged ch_1", string(got.Result))
		require.Equal(t, 2, got.Attempts)
	})
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	require.True(t, strings.HasPrefix(db.ProviderKey(receipts.Key{Scope: "acct_2", ID: "op-lost"}), "rk_"))
	cli(t, "--addr", "http://127.0.0.1:1/admin/receipts", "reconcile").requireCode(t, exitUsage)
}

func TestPGReconcile(t *testing.T) {
	pgtest.DSN(t)
	store := newPGFixture(t, receipts.Options{})
	testReconcile(t, store, []string{"--not-performed"}, func(t *testing.T) {
		cli(t, pgArgs(store, "get", "acct_2", "op-lost")...).requireCode(t, exitProblem) // the key is free
	})
}
