package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestMain runs the tests, checking that none leaves a goroutine behind. When
// the demo re-executes this test binary as its child process (demoChildEnv
// set), it acts as receiptctl instead.
func TestMain(m *testing.M) {
	if os.Getenv(demoChildEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	pgtest.Main(pgtest.LeakChecked(m))
}

// cliResult is what one in-process run of receiptctl printed and returned.
type cliResult struct {
	code        int
	out, stderr string
}

// cli runs receiptctl in-process.
func cli(t *testing.T, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return cliResult{code: code, out: out.String(), stderr: errb.String()}
}

// requireCode checks the exit code, showing the output if it is wrong.
func (r cliResult) requireCode(t *testing.T, code int) cliResult {
	t.Helper()
	require.Equal(t, code, r.code, "stdout:\n%s\nstderr:\n%s", r.out, r.stderr)
	return r
}

var fp = []byte("fingerprint")

// newFixture creates a store in a new directory with one record of each
// kind, closes it and returns the directory:
//
//	acct_1/op-ok      succeeded  "ok:1"
//	acct_1/op-bin     succeeded  0x00 0x01 0x02 0xff
//	acct_1/op-failed  failed     "card declined"
//	acct_2/op-lost    pending, abandoned (the attempt's outcome is unknown)
//	acct_2/op-live    pending, lease live (30s)
//	acct_2/"tab\tid"  succeeded  "multi\nline"
func newFixture(t *testing.T) string {
	t.Helper()
	return newFixtureOpts(t, &receipts.Options{GCInterval: -1})
}

// newFixtureOpts is newFixture with the store opened with opts.
func newFixtureOpts(t *testing.T, opts *receipts.Options) string {
	t.Helper()
	dir := t.TempDir()
	db, err := receipts.Open(dir, opts)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	fillFixture(t, db)
	return dir
}

func fillFixture(t *testing.T, db *receipts.DB) {
	t.Helper()
	ctx := context.Background()
	ok := func(res []byte) func(context.Context, *receipts.Lease) ([]byte, error) {
		return func(context.Context, *receipts.Lease) ([]byte, error) { return res, nil }
	}
	k := func(scope, id string) receipts.Key { return receipts.Key{Scope: scope, ID: id} }
	_, err := db.Do(ctx, k("acct_1", "op-ok"), fp, ok([]byte("ok:1")))
	require.NoError(t, err)
	_, err = db.Do(ctx, k("acct_1", "op-bin"), fp, ok([]byte{0, 1, 2, 0xff}))
	require.NoError(t, err)
	_, err = db.Do(ctx, k("acct_1", "op-failed"), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("card declined"), receipts.Permanent(errors.New("declined"))
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	_, err = db.Do(ctx, k("acct_2", "op-lost"), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, errors.New("timeout: outcome unknown")
	})
	require.Error(t, err)
	l, _, err := db.Claim(ctx, k("acct_2", "op-live"), fp)
	require.NoError(t, err)
	require.NotNil(t, l)
	_, err = db.Do(ctx, k("acct_2", "tab\tid"), fp, ok([]byte("multi\nline")))
	require.NoError(t, err)
}
