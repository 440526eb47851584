package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

// TestAddr runs the read-only commands against a running service that mounts
// receiptadmin.Handler, and checks they show what the offline commands show.
func TestAddr(t *testing.T) {
	offlineDir := newFixture(t)
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	fillFixture(t, db)

	mux := http.NewServeMux()
	mux.Handle("/admin/receipts/", receiptadmin.Handler(db))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := srv.URL + "/admin/receipts"

	// get
	r := cli(t, "--addr", addr, "get", "acct_1", "op-bin").requireCode(t, exitOK)
	require.Contains(t, r.out, "result         base64:AAEC/w==\n")
	r = cli(t, "get", "--addr", addr, "acct_2", "tab\tid", "--json").requireCode(t, exitOK)
	var a receiptadmin.Receipt
	require.NoError(t, json.Unmarshal([]byte(r.out), &a))
	require.Equal(t, receipts.Key{Scope: "acct_2", ID: "tab\tid"}, a.Key())
	require.Equal(t, []byte("multi\nline"), a.Result)
	r = cli(t, "--addr", addr, "get", "acct_1", "nope").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, `no record of "acct_1"/"nope"`)

	// ls: the same views as offline, filters included.
	for _, f := range [][]string{nil, {"--scope", "acct_1"}, {"--state", "pending"}, {"--abandoned"}, {"--state", "failed"}} {
		live := lsIDs(t, append([]string{"--addr", addr}, f...)...)
		off := lsIDs(t, append([]string{"--dir", offlineDir}, f...)...)
		require.ElementsMatch(t, off, live, "%q", f)
		// The filters go after "ls": put them there.
		lt := cli(t, append([]string{"--addr", addr, "ls"}, f...)...).requireCode(t, exitOK)
		ot := cli(t, append([]string{"--dir", offlineDir, "ls"}, f...)...).requireCode(t, exitOK)
		require.Equal(t, strings.Count(ot.out, "\n"), strings.Count(lt.out, "\n"), "%q", f)
	}
	require.Len(t, lsIDs(t, "--addr", addr, "--limit", "1"), 1)
	r = cli(t, "--addr", addr, "ls").requireCode(t, exitOK)
	require.Regexp(t, `op-lost\s+pending \(abandoned\)`, r.out)

	// stats, with the service's counters.
	r = cli(t, "--addr", addr, "stats", "--json").requireCode(t, exitOK)
	var s receiptadmin.Stats
	require.NoError(t, json.Unmarshal([]byte(r.out), &s))
	require.Equal(t, int64(3), s.Succeeded)
	require.Equal(t, int64(1), s.Abandoned)
	require.Equal(t, "30s", s.LeaseTTL)
	require.Equal(t, uint64(6), s.Counters.Claims)
	r = cli(t, "--addr", addr, "stats").requireCode(t, exitOK)
	require.Regexp(t, `(?m)^since open\s+claims 6,`, r.out)
	require.Regexp(t, `(?m)^retention\s+24h0m0s$`, r.out)

	// export
	r = cli(t, "--addr", addr, "export").requireCode(t, exitOK)
	require.Equal(t, 6, strings.Count(r.out, "\n"))

	// Wrong address: not the admin handler, or nothing listening.
	r = cli(t, "--addr", srv.URL+"/elsewhere", "ls").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "receiptadmin.Handler")
	srv.Close()
	r = cli(t, "--addr", addr, "stats").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "cannot reach the service")
}
