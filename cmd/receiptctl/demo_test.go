package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkDemoReport checks what the demo reported, and the store it left.
func checkDemoReport(t *testing.T, rep demoReport, dir string) {
	t.Helper()
	require.Equal(t, dir, rep.Dir)
	require.Equal(t, int64(15), rep.CallsAttempted)
	require.Equal(t, 4, rep.EffectsPerformed)
	require.Equal(t, 0, rep.DuplicateEffects)
	require.Equal(t, 1, rep.HostRestarts)
	require.Equal(t, map[string]int64{"succeeded": 4, "failed": 1, "pending": 0}, rep.Receipts)
	require.Equal(t, "receiptctl --dir "+dir+" ls", rep.LsCommand)

	// The store holds what the report says, and nothing is left to reconcile.
	ids := lsIDs(t, "--dir", dir)
	require.Len(t, ids, 5)
	require.Subset(t, ids, []string{"trip-1", "pay-1", "mail-1", "xfer-1"})
	require.Empty(t, lsIDs(t, "--dir", dir, "--abandoned"))
	r := cli(t, "--dir", dir, "get", demoScope, "xfer-1").requireCode(t, exitOK)
	require.Contains(t, r.out, "attempts       2\n") // the crashed attempt, then the recovery
	require.Contains(t, r.out, "result         conf-0003\n")
	cli(t, "--dir", dir, "verify").requireCode(t, exitOK)

	// The host's journal: the refund, answered, under the key of the fifth
	// receipt.
	r = cli(t, "actions", filepath.Join(dir, demoHostDir)).requireCode(t, exitOK)
	require.Contains(t, r.out, "1 action: 1 succeeded")
	require.Contains(t, r.out, "POST /v1/refunds")
	require.Regexp(t, `201 conf-0004\n`, r.out)

	// The provider performed each effect once.
	effects, err := (&provider{path: filepath.Join(dir, providerLog)}).effects()
	require.NoError(t, err)
	require.Len(t, effects, 4)
	seen := map[string]bool{}
	for _, e := range effects {
		require.False(t, seen[e.IdempotencyKey], "duplicate effect %+v", e)
		seen[e.IdempotencyKey] = true
	}
}

// TestDemo runs the demo in-process; its child process is this test binary
// (see TestMain).
func TestDemo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	r := cli(t, "demo", "--dir", dir, "--json").requireCode(t, exitOK)
	var rep demoReport
	require.NoError(t, json.Unmarshal([]byte(r.out), &rep), r.out)
	checkDemoReport(t, rep, dir)

	// A demo needs a fresh directory.
	cli(t, "demo", "--dir", dir).requireCode(t, exitUsage)
	cli(t, "demo", "--addr", "http://127.0.0.1:1").requireCode(t, exitUsage)
}

// TestDemoBinary builds receiptctl and runs its demo as people do, with the
// story on stdout.
func TestDemoBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel() // the build overlaps the other tests
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "receiptctl")
	build := exec.Command(gobin, "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	dir := filepath.Join(t.TempDir(), "demo")
	cmd := exec.Command(bin, "demo", "--dir", dir)
	out, err = cmd.Output()
	require.NoError(t, err, "%s", out)
	story := string(out)
	for _, want := range []string{
		`(?m)^1\. Lost responses: the agent retries book_flight`,
		`(?m)^   call 1  ran it: the provider performed it -> conf-0001`,
		`(?m)^   call 2  replayed the receipt -> conf-0001; nothing ran`,
		`(?m)^   1 ran it, 3 got its receipt instead of running it: all 4 got conf-0002$`,
		`(?m)^   call 1  rejected: same key, different arguments; nothing ran$`,
		`(?m)^   call 1  the provider declined: mailbox traveller@example.invalid unavailable; stored as a failed receipt$`,
		`(?m)^   call 2  replayed the failed receipt: mailbox traveller@example.invalid unavailable; nothing ran$`,
		`and the child is killed \(signal: killed\) before it records the receipt`,
		`(?m)^   restart: xfer-1 is pending \(attempt 1, lease runs out in`,
		`took the claim over \(attempt 2, Recovered\)`,
		`(?m)^           asked the provider by ProviderKey: it already has conf-0003; committed that, not performed again$`,
		`(?m)^6\. A host crash: the agent host approves refund\(amount_cents=5000, currency=EUR\)`,
		`and the host is killed \(signal: killed\) before the answer reaches it`,
		`(?m)the same action, key [0-9a-f-]{36}; delivered under it, the service answers from its receipt -> conf-0004$`,
		`(?m)^  calls attempted\s+15$`,
		`(?m)^  effects performed\s+4\s`,
		`(?m)^  duplicate effects\s+0$`,
		`(?m)^  host restarts\s+1\s`,
		`(?m)^  receipts\s+4 succeeded, 1 failed, 0 pending$`,
		`(?m)^Look at them: receiptctl --dir ` + regexp.QuoteMeta(dir) + ` ls$`,
	} {
		require.Regexp(t, want, story)
	}

	// The binary reads the demo's store too.
	ls := exec.Command(bin, "--dir", dir, "ls")
	out, err = ls.Output()
	require.NoError(t, err)
	require.Regexp(t, `xfer-1\s+succeeded\s+2\s`, string(out))
}
