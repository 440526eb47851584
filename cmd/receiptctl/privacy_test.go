package main

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

// TestAddrToken: --token, or RECEIPTCTL_TOKEN, is sent as a bearer token to a handler
// served with receiptadmin.BearerToken; without it the handler's 401 is reported.
func TestAddrToken(t *testing.T) {
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	fillFixture(t, db)
	mux := http.NewServeMux()
	mux.Handle("/admin/receipts/", receiptadmin.Handler(db, receiptadmin.Authorize(receiptadmin.BearerToken("tok-123"))))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := srv.URL + "/admin/receipts"

	r := cli(t, "--addr", addr, "stats").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "401")
	require.Contains(t, r.stderr, "no bearer token")
	r = cli(t, "--addr", addr, "--token", "wrong", "stats").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "wrong bearer token")
	cli(t, "--addr", addr, "--token", "tok-123", "get", "acct_1", "op-ok").requireCode(t, exitOK)
	t.Setenv(envToken, "tok-123")
	cli(t, "--addr", addr, "ls").requireCode(t, exitOK)
}

// TestPGFromEnv: RECEIPTCTL_PG names the store when no --dir, --pg or --addr is given, and
// gives way to them.
func TestPGFromEnv(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	fillFixture(t, openPGStore(t, dsn, schema, receipts.Options{}))
	t.Setenv(envPG, dsn)
	r := cli(t, "--schema", schema, "get", "acct_1", "op-ok").requireCode(t, exitOK)
	require.Contains(t, r.out, "result         ok:1\n")
	dir := newFixture(t)
	cli(t, "--dir", dir, "get", "acct_1", "op-ok").requireCode(t, exitOK) // --dir wins
	t.Setenv(envPG, "")
	cli(t, "--schema", schema, "get", "acct_1", "op-ok").requireCode(t, exitUsage)
}

// TestHashedKeys: on a store whose keys are hashed (Options.HashKeys), get takes the raw
// scope and ID and finds them, ls shows hashes unless given the raw scope.
func TestHashedKeys(t *testing.T) {
	dir := newFixtureOpts(t, &receipts.Options{GCInterval: -1, HashKeys: true})
	r := cli(t, "--dir", dir, "get", "acct_1", "op-ok").requireCode(t, exitOK)
	require.Contains(t, r.out, "result         ok:1\n")
	require.Contains(t, r.out, "acct_1")
	r = cli(t, "--dir", dir, "--json", "ls").requireCode(t, exitOK)
	require.NotContains(t, r.out, "acct_1")
	require.NotContains(t, r.out, "op-ok")
	r = cli(t, "--dir", dir, "--json", "ls", "--scope", "acct_1").requireCode(t, exitOK)
	require.Contains(t, r.out, `"scope":"acct_1"`)
	require.NotContains(t, r.out, "op-ok")
	require.Contains(t, r.out, `"result":"b2s6MQ=="`) // ok:1
}

// TestHashedKeysListedFormAccepted (issue 43, item 6): on a store whose keys are hashed, ls
// and reconcile show a stored key quoted ("\x00h…": its NUL byte cannot be typed), and get,
// reconcile and erase take that listed form back, as docs/privacy.md promises for every call.
func TestHashedKeysListedFormAccepted(t *testing.T) {
	dir := newFixtureOpts(t, &receipts.Options{GCInterval: -1, HashKeys: true})
	quoted := `("(?:[^"\\]|\\.)*")`
	row := func(out, state string) []string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^` + quoted + `\s+` + quoted + `\s+` + regexp.QuoteMeta(state) + `\s`).FindStringSubmatch(out)
		require.NotNil(t, m, "no %s row in\n%s", state, out)
		return m[1:]
	}
	ls := cli(t, "--dir", dir, "ls").requireCode(t, exitOK).out
	failed := row(ls, "failed")
	r := cli(t, "--dir", dir, "get", failed[0], failed[1]).requireCode(t, exitOK)
	require.Contains(t, r.out, "card declined")

	// reconcile: the listing's abandoned claim, settled by its listed key and token
	list := cli(t, "--dir", dir, "reconcile").requireCode(t, exitOK).out
	m := regexp.MustCompile(`(?m)^` + quoted + `\s+` + quoted + `\s+\d+\s+(\d+)\s`).FindStringSubmatch(list)
	require.NotNil(t, m, "no claim in\n%s", list)
	cli(t, "--dir", dir, "reconcile", m[1], m[2], "--token", m[3], "--fail", "refunded by hand").requireCode(t, exitOK)
	r = cli(t, "--dir", dir, "get", m[1], m[2]).requireCode(t, exitOK)
	require.Contains(t, r.out, "refunded by hand")

	// erase: the scope by its listed form; its keys are then refused, the other scope's kept
	cli(t, "--dir", dir, "erase", failed[0], "--yes").requireCode(t, exitOK)
	cli(t, "--dir", dir, "get", failed[0], failed[1]).requireCode(t, exitProblem)
	cli(t, "--dir", dir, "get", "acct_1", "op-ok").requireCode(t, exitProblem) // the same scope, raw
	ls = cli(t, "--dir", dir, "ls").requireCode(t, exitOK).out
	require.NotContains(t, ls, failed[0])
	require.NotEmpty(t, row(ls, "succeeded"), "the other scope")

	cli(t, "--dir", dir, "get", `"\x0"`, "x").requireCode(t, exitUsage) // not a Go string literal
}
