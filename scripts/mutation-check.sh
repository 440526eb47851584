#!/usr/bin/env bash
# mutation-check.sh: show that every reliability harness fails when the
# engine is broken on purpose.
#
# The engine carries test-only mutation switches (internal/mutate), compiled
# in only with the build tag receipts_mutate and picked by RECEIPTS_MUTATION:
#   nosync    commits and claims are written without sync
#   nolock    claims skip the per-key lock
#   naivekey  record keys concatenate scope and id without a length prefix
#   nofence   commits skip the fencing-token check
#   stalecache the replay cache answers for receipts past retention
#   cachekeep  writes of a key keep its replay-cache entry
#   cacheraw   the replay cache answers from memory after DB.Pebble
#   nocopy     a replay from memory hands out the cache's own bytes
#   memokeep   writes of a key keep the memo of its last Pending record
#   memoraw    writes decide from that memo after DB.Pebble
#   histshard  the observers' striped histograms and counters (internal/hot) sum
#              only their first stripe when read (receiptsprom's tests catch it)
#   otelunmarked receiptsotel's sampler leaves an operation it sampled out
#              unmarked, so the operations nested in it draw again
#              (receiptsotel's sampling tests catch it)
#   unknownfree the outcome protocol releases the claim of an unknown outcome
#              (the conformance kit, on Pebble and on PostgreSQL, catches it)
#   nogcmarkers GC drops an epoch's records without writing their tombstone
#              markers (the tombstone crash tests catch it)
#   pgnogcmarkers PostgreSQL's GC drops a records partition without copying
#              its records' markers (pgstore's tombstone tests catch it)
#   pgbatchswap each member of a batched PostgreSQL statement (claims, finishes,
#              replay reads sent together) gets the next member's row
#              (pgstore's batch tests catch it)
#   pgreadnow  PostgreSQL's read-back after a lost COMMIT reply reads at once,
#              without waiting for the transaction to end on the server
#              (pgstore's lost-commit-reply tests catch it)
#   pgwrongpart PostgreSQL's statements aimed at one records partition (a finish,
#              a replay's read) name the partition before the right one: they
#              find no row and the parent's statements answer, correctly and
#              slower (pgstore's one-partition tests, which count them, catch it)
#   stepanypos Lease.Step replays a finished step from the journal's last
#              finished entry, unchecked: another position's result (the
#              model's TestModelSteps and the kit's Steps topic catch it)
#   steprerun  Lease.Step treats a finished step as started: a recorded step
#              runs again (TestModelSteps and the kit's Steps topic catch it)
#   pgrawalias a record pgstore decodes from its binary columns keeps pgx's read
#              buffer as its byte slices (TestReadRecordAsScan catches it)
#   reccanon   the record decoder's fast path reads a uint 16 as its low byte
#              (TestRecordCodecMatchesMsgpack catches it)
#   tallydrop  DB.Do reports a replay answered at once to no ReplayObserver
#              (receiptsprom's and receiptsotel's TestReplayObserverMatchesEvents
#              catch it)
#
# The script builds each harness package's tests once with the tag (the
# packages and their harnesses are listed below, as in TestMutationCheck in
# tests), runs every harness unmutated (each must pass, or the
# check means nothing), then runs each harness under each mutation. "caught" = the harness failed. It prints
# a Markdown table and exits 1 if some mutation survives every harness,
# 2 if the setup is broken (build failure, a harness failing unmutated).
#
# Usage: scripts/mutation-check.sh [-short] [-o table.md] [-run REGEXP]
#   -short  smaller harness sizes (RECEIPTS_CRASHES=12, RECEIPTS_KILLS=25)
#   -o      also write the table to a file
#   -run    only the harnesses whose name matches REGEXP
set -u
cd "$(dirname "$0")/.."

short=0
out=""
only=""
while [ $# -gt 0 ]; do
	case "$1" in
	-short) short=1 ;;
	-o) out="$2"; shift ;;
	-run) only="$2"; shift ;;
	*) echo "usage: $0 [-short] [-o table.md] [-run REGEXP]" >&2; exit 2 ;;
	esac
	shift
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The harness packages and, for each, a regexp for -test.list that names its
# harnesses. Keep in step with suites in tests/mutation_test.go.
suites=(
	"./tests/crash ^TestCrashPowerLoss$"
	"./tests/kill ^TestKillProcess$"
	"./tests/fault ^(TestFaultWriteErrorAtK|TestFaultOpenAtK|TestFaultWALSyncFailStop|TestFaultReturningFatalfIsFailStop|TestFaultRandomReadErrors)$"
	"./tests/model ^TestModel"
	"./tests/linearize ^TestLinearizability"
	"./tests/isolation ^TestScopeIsolation"
	"./internal/pebbleengine ^(TestWriteDeletesCacheEntry|TestReplayFromMemory|TestWriteDeletesMemo|TestFinishDecidesFromMemo)$"
	". ^TestReplayFromMemoryAllocatesOnce$"
	"./receiptsprom ^(TestHistMatchesPrometheus|TestCtrCountsEveryInc|TestReplayObserverMatchesEvents)$"
	"./receiptsotel ^(TestSampledOutStartsNoSpan|TestUnsampledParentStartsNoSpan|TestSampledParentStillRecords|TestSampledOperationsComplete|TestReplayObserverMatchesEvents)$"
	". ^TestConformance$"
	"./pgstore ^TestConformance$"
	". ^(TestCrashTombstoneSurvivesPowerLoss|TestCrashDuringGCKeepsTombstones)$"
	"./pgstore ^(TestTombstoneEveryClaimPath|TestTombstoneRecordIsItsOwnTombstone|TestTombstoneGCCrashBetweenCopyAndDrop)$"
	"./pgstore ^(TestClaimBatch|TestFinishBatch|TestLookupBatch)$"
	"./pgstore ^(TestDoTxLostCommitReply|TestStagedEffectLostCommitReply|TestDoTxAbandonLostCommitReply)$"
	"./pgstore ^(TestFinishInOnePartition|TestReplayFastOnePartition)$"
	"./pgstore ^TestReadRecordAsScan$"
	"./encoding ^TestRecordCodecMatchesMsgpack$"
)

harnesses=()      # harness ids: the test's name, or name@package when two packages have it
declare -A testof # harness id -> test name
declare -A binof # harness id -> its package's test binary
declare -A dirof # harness id -> its package's directory (go test runs a test there: testdata)
declare -A built # package -> binary
for s in "${suites[@]}"; do
	pkg="${s%% *}" re="${s#* }"
	if [ -z "${built[$pkg]:-}" ]; then
		bin="$work/$(echo "$pkg" | tr -c 'a-zA-Z0-9\n' _).test"
		echo "building $pkg's tests with -tags receipts_mutate ..." >&2
		if ! go test -c -tags receipts_mutate -o "$bin" "$pkg" >&2; then
			echo "build of $pkg failed" >&2
			exit 2
		fi
		built[$pkg]="$bin"
	fi
	bin="${built[$pkg]}"
	n=0
	while read -r h; do
		case "$h" in Test*)
			id="$h"
			if [ -n "${binof[$id]:-}" ]; then id="$h@${pkg#./}"; fi
			harnesses+=("$id"); testof[$id]="$h"; binof[$id]="$bin"; dirof[$id]="$pkg"; n=$((n + 1)) ;;
		esac
	done < <("$bin" -test.list "$re" 2>/dev/null)
	if [ "$n" = 0 ]; then
		echo "$pkg has no test matching $re" >&2
		exit 2
	fi
done
if [ -n "$only" ]; then
	sel=()
	for h in "${harnesses[@]}"; do
		if echo "$h" | grep -Eq -- "$only"; then sel+=("$h"); fi
	done
	harnesses=("${sel[@]}")
fi

mutations=(nosync nolock naivekey nofence stalecache cachekeep cacheraw nocopy memokeep memoraw histshard otelunmarked unknownfree nogcmarkers pgnogcmarkers pgbatchswap pgreadnow pgwrongpart stepanypos steprerun pgrawalias reccanon tallydrop)
timeout=600s
envs=()
if [ "$short" = 1 ]; then
	envs=(RECEIPTS_CRASHES=12 RECEIPTS_KILLS=25)
fi

# run HARNESS MUTATION -> prints pass | FAIL | TIMEOUT, keeps the log
run() {
	local h="$1" m="$2" log="$work/${1//[^A-Za-z0-9]/_}.$2.log" start end
	start=$(date +%s)
	(cd "${dirof[$h]}" && env "${envs[@]}" RECEIPTS_MUTATION="$m" "${binof[$h]}" -test.run "^${testof[$h]}\$" -test.count=1 -test.timeout="$timeout") >"$log" 2>&1
	local rc=$?
	end=$(date +%s)
	if [ $rc = 0 ]; then
		echo "pass $((end - start))s"
	elif grep -q "panic: test timed out" "$log"; then
		echo "TIMEOUT $((end - start))s"
	else
		echo "FAIL $((end - start))s"
	fi
}

declare -A result
setup_ok=1
for h in "${harnesses[@]}"; do
	r=$(run "$h" "")
	echo "unmutated  $h: $r" >&2
	result["$h,none"]="$r"
	if [ "${r%% *}" != pass ]; then
		echo "  $h fails without a mutation; log:" >&2
		tail -30 "$work/${h//[^A-Za-z0-9]/_}..log" >&2
		setup_ok=0
	fi
done

declare -A caught_by
for m in "${mutations[@]}"; do
	for h in "${harnesses[@]}"; do
		r=$(run "$h" "$m")
		result["$h,$m"]="$r"
		echo "$m  $h: $r" >&2
		case "${r%% *}" in
		FAIL | TIMEOUT)
			caught_by[$m]="${caught_by[$m]:-} $h"
			# the first lines that say why
			grep -v -e '--- FAIL' -e 'Error Trace' "$work/${h//[^A-Za-z0-9]/_}.$m.log" | grep -m2 -E "violation|check [0-9]+:|gen [0-9]+:|Error|FAIL:|lost|duplicate|porcupine|unexpected|timed out" | sed 's/^ */      /' | cut -c1-200 >&2
			;;
		esac
	done
done

cell() {
	case "${1%% *}" in
	pass) echo "survived (${1#* })" ;;
	FAIL) echo "**caught** (${1#* })" ;;
	TIMEOUT) echo "**caught: hung** (${1#* })" ;;
	*) echo "?" ;;
	esac
}

table() {
	printf '| harness | unmutated |'; for m in "${mutations[@]}"; do printf ' %s |' "$m"; done; echo
	printf '|---|---|'; for _ in "${mutations[@]}"; do printf -- '---|'; done; echo
	for h in "${harnesses[@]}"; do
		line="| $h | ${result["$h,none"]%% *} (${result["$h,none"]#* })"
		for m in "${mutations[@]}"; do
			line="$line | $(cell "${result["$h,$m"]}")"
		done
		echo "$line |"
	done
	line="| **caught by** | "
	for m in "${mutations[@]}"; do
		n=$(echo ${caught_by[$m]:-} | wc -w)
		line="$line | $n of ${#harnesses[@]}"
	done
	echo "$line |"
}

echo
table
if [ -n "$out" ]; then
	table >"$out"
fi

if [ "$setup_ok" != 1 ]; then
	echo "some harness fails without any mutation: the table means nothing" >&2
	exit 2
fi
survived=0
for m in "${mutations[@]}"; do
	if [ -z "${caught_by[$m]:-}" ]; then
		echo "mutation $m survived every harness" >&2
		survived=1
	fi
done
exit $survived
