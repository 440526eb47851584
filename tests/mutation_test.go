package tests_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// suites are the harness packages (relative to the module root) and, for
// each, a regexp for -test.list that names its harnesses. Keep in step with
// suites in scripts/mutation-check.sh.
var suites = []struct{ pkg, list string }{
	{"./tests/crash", "^TestCrashPowerLoss$"},
	{"./tests/kill", "^TestKillProcess$"},
	{"./tests/fault", "^(TestFaultWriteErrorAtK|TestFaultOpenAtK|TestFaultWALSyncFailStop|TestFaultReturningFatalfIsFailStop|TestFaultRandomReadErrors)$"},
	{"./tests/model", "^TestModel"},
	{"./tests/linearize", "^TestLinearizability"},
	{"./tests/isolation", "^TestScopeIsolation"},
	// The replay cache's memory answers and the memo of the last Pending
	// record written: the invariants a black-box harness cannot see (a
	// finished record never changes while visible, so a stale entry is an
	// expired one; writes behind the engine's back, through the raw
	// handle) are checked on the engine itself.
	{"./internal/pebbleengine", "^(TestWriteDeletesCacheEntry|TestReplayFromMemory|TestWriteDeletesMemo|TestFinishDecidesFromMemo)$"},
	{".", "^TestReplayFromMemoryAllocatesOnce$"},
	// receiptsprom's striped histograms and counters, against client_golang's own; and a
	// replay taken as one ObserveReplay, against the same replay as events.
	{"./receiptsprom", "^(TestHistMatchesPrometheus|TestCtrCountsEveryInc|TestReplayObserverMatchesEvents)$"},
	// receiptsotel's own sampler: an operation sampled out, and what is nested in it, start
	// no span; and a replay taken as one ObserveReplay, against the same replay as events.
	{"./receiptsotel", "^(TestSampledOutStartsNoSpan|TestUnsampledParentStartsNoSpan|TestSampledParentStillRecords|TestSampledOperationsComplete|TestReplayObserverMatchesEvents)$"},
	// The outcome protocol, written once (Lease.conclude): the conformance kit on both
	// engines.
	{".", "^TestConformance$"},
	{"./pgstore", "^TestConformance$"},
	// Tombstones written by GC, off the write path: a crash anywhere in GC
	// leaves a dropped key its record or its marker.
	{".", "^(TestCrashTombstoneSurvivesPowerLoss|TestCrashDuringGCKeepsTombstones)$"},
	// The same on PostgreSQL: GC copies a records partition's markers before it drops
	// the partition, and a crash between the two leaves both.
	{"./pgstore", "^(TestTombstoneEveryClaimPath|TestTombstoneRecordIsItsOwnTombstone|TestTombstoneGCCrashBetweenCopyAndDrop)$"},
	// Statements of different keys sent together (pgstore's combiner): each key gets the
	// decision, the write and the read of its own row.
	{"./pgstore", "^(TestClaimBatch|TestFinishBatch|TestLookupBatch)$"},
	// A lost COMMIT reply: the read-back waits for the transaction to end on the server.
	{"./pgstore", "^(TestDoTxLostCommitReply|TestStagedEffectLostCommitReply|TestDoTxAbandonLostCommitReply)$"},
	// Statements aimed at one records partition: used, and at the right one.
	{"./pgstore", "^(TestFinishInOnePartition|TestReplayFastOnePartition)$"},
	// A record decoded from PostgreSQL's binary columns, and from the forms AppendRecord
	// writes, reads as pgx's Scan and msgpack's decoder read it.
	{"./pgstore", "^TestReadRecordAsScan$"},
	{"./encoding", "^TestRecordCodecMatchesMsgpack$"},
}

// TestMutationCheck is scripts/mutation-check.sh in short form, for CI to
// run when it chooses (RECEIPTS_MUTATION_CHECK=1; it takes a few minutes):
// it builds each harness package's tests with -tags receipts_mutate, checks
// that every harness passes unmutated, runs every harness under every
// mutation (nosync, nolock, naivekey, nofence, stalecache, cachekeep,
// cacheraw, nocopy, memokeep, memoraw, histshard, otelunmarked, unknownfree, nogcmarkers,
// pgnogcmarkers, pgbatchswap, pgreadnow, pgwrongpart, stepanypos, steprerun, pgrawalias,
// reccanon, tallydrop), logs the table,
// and fails if a mutation survives every harness.
func TestMutationCheck(t *testing.T) {
	if os.Getenv("RECEIPTS_MUTATION_CHECK") != "1" {
		t.Skip("set RECEIPTS_MUTATION_CHECK=1 (or run scripts/mutation-check.sh)")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	root, err := exec.Command(gobin, "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("module root: %v", err)
	}
	dir := t.TempDir()
	var harnesses []string
	binOf := make(map[string]string)  // harness -> its package's test binary
	testOf := make(map[string]string) // harness -> its test's name (a harness is name@package when two packages have the name)
	built := make(map[string]string)  // package -> binary
	for i, s := range suites {
		bin, ok := built[s.pkg]
		if !ok {
			bin = filepath.Join(dir, fmt.Sprintf("suite%d.test", i))
			cmd := exec.Command(gobin, "test", "-c", "-tags", "receipts_mutate", "-o", bin, s.pkg)
			cmd.Dir = strings.TrimSpace(string(root))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("build %s: %v\n%s", s.pkg, err, out)
			}
			built[s.pkg] = bin
		}
		out, err := exec.Command(bin, "-test.list", s.list).Output()
		if err != nil {
			t.Fatalf("list %s: %v", s.pkg, err)
		}
		n := 0
		for _, h := range strings.Fields(string(out)) {
			if strings.HasPrefix(h, "Test") {
				id := h
				if _, dup := binOf[id]; dup {
					id = h + "@" + strings.TrimPrefix(s.pkg, "./")
				}
				harnesses = append(harnesses, id)
				binOf[id], testOf[id] = bin, h
				n++
			}
		}
		if n == 0 {
			t.Fatalf("%s has no test matching %s", s.pkg, s.list)
		}
	}

	type outcome struct {
		failed bool
		dur    time.Duration
		why    string
	}
	run := func(h, m string) outcome {
		ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binOf[h], "-test.run=^"+testOf[h]+"$", "-test.count=1", "-test.timeout=600s")
		cmd.Env = append(os.Environ(), "RECEIPTS_MUTATION="+m, "RECEIPTS_CRASHES=12", "RECEIPTS_KILLS=25", "RECEIPTS_MUTATION_CHECK=")
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		start := time.Now()
		err := cmd.Run()
		o := outcome{failed: err != nil, dur: time.Since(start).Round(100 * time.Millisecond)}
		if o.failed {
			re := regexp.MustCompile(`violation|check \d+:|gen \d+:|FAIL:|lost|duplicate|porcupine|timed out|Error:`)
			for _, line := range strings.Split(buf.String(), "\n") {
				if re.MatchString(line) && !strings.Contains(line, "--- FAIL") {
					o.why = strings.TrimSpace(line)
					break
				}
			}
			if len(o.why) > 160 {
				o.why = o.why[:160]
			}
		}
		return o
	}

	mutations := []string{"nosync", "nolock", "naivekey", "nofence", "stalecache", "cachekeep", "cacheraw", "nocopy", "memokeep", "memoraw", "histshard", "otelunmarked", "unknownfree", "nogcmarkers", "pgnogcmarkers", "pgbatchswap", "pgreadnow", "pgwrongpart", "stepanypos", "steprerun", "pgrawalias", "reccanon", "tallydrop"}
	var table strings.Builder
	table.WriteString("| harness | unmutated | " + strings.Join(mutations, " | ") + " |\n|---|---|" + strings.Repeat("---|", len(mutations)) + "\n")
	caught := make(map[string]int)
	for _, h := range harnesses {
		base := run(h, "")
		if base.failed {
			t.Errorf("%s fails without a mutation: %s", h, base.why)
		}
		fmt.Fprintf(&table, "| %s | %s (%s) ", h, map[bool]string{false: "pass", true: "FAIL"}[base.failed], base.dur)
		for _, m := range mutations {
			o := run(h, m)
			if o.failed {
				caught[m]++
				fmt.Fprintf(&table, "| **caught** (%s) ", o.dur)
				t.Logf("%s under %s: %s", h, m, o.why)
			} else {
				fmt.Fprintf(&table, "| survived (%s) ", o.dur)
			}
		}
		table.WriteString("|\n")
	}
	table.WriteString("| **caught by** | ")
	for _, m := range mutations {
		fmt.Fprintf(&table, "| %d of %d ", caught[m], len(harnesses))
	}
	table.WriteString("|\n")
	t.Logf("mutation table (short sizes):\n%s", table.String())
	for _, m := range mutations {
		if caught[m] == 0 {
			t.Errorf("mutation %s survived every harness", m)
		}
	}
}
