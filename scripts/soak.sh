#!/usr/bin/env bash
# soak.sh: the long versions of the reliability harnesses (RECEIPTS_SOAK=1),
# the packages under tests:
#
#   TestCrashPowerLoss          2,000 power-loss crashes per mode (p0, prand)
#   TestKillProcess             2,000 SIGKILL cycles of a child process
#   TestFaultWriteErrorAtK      600 ops per run, a write error at every k
#   TestFaultRandomReadErrors   200 rounds per read-error probability
#   TestFaultOpenAtK, TestFaultWALSync*  (same as CI)
#   TestLinearizability, TestModel, TestScopeIsolation (their own soak sizes)
#   TestHostKill, TestHostKillPostgres  500 host SIGKILL cycles per transport and engine
#                               (the intents host against receipthttp/receiptmcp; RECEIPTS_HOST_KILLS=n)
#   tests/pgnodes TestCrossNode*  10 minutes each: Pebble 600 SIGKILLs; PostgreSQL 3 nodes,
#                               400 SIGKILLs, 20 server restarts (RECEIPTS_PGNODES_SECONDS,
#                               _KILLS, _RESTARTS, _NODES override; PGNODES_SKIP=1 skips them)
#   tests/pgnodes TestFailover   5 minutes, five failovers of a primary and its synchronous
#                               standby (RECEIPTS_FAILOVER_SECONDS, _FAILOVERS, _NODES, _LAG_MS);
#                               TestFailoverAsync the same with asynchronous replication, which
#                               prints what the failovers lost and does not fail
#
# Usage: scripts/soak.sh [-race] [-run REGEXP] [-seed N]
#   RECEIPTS_CRASHES=n / RECEIPTS_KILLS=n override the crash and kill counts.
# Every harness logs its seed; rerun a failure with RECEIPTS_SEED=<seed>.
set -u
cd "$(dirname "$0")/.."

race=""
run='^(TestCrashPowerLoss|TestKillProcess|TestFault.*|TestLinearizability.*|TestModel.*|TestScopeIsolation.*|TestHostKill.*)$'
while [ $# -gt 0 ]; do
	case "$1" in
	-race) race="-race" ;;
	-run) run="$2"; shift ;;
	-seed) export RECEIPTS_SEED="$2"; shift ;;
	*) echo "usage: $0 [-race] [-run REGEXP] [-seed N]" >&2; exit 2 ;;
	esac
	shift
done

log=$(mktemp -t receipts-soak.XXXXXX)
# The harness packages (tests/*), one at a time (-p 1).
pkgs="./tests/..."
echo "soak: go test $race -p 1 -run '$run' $pkgs (log: $log)" >&2
start=$(date +%s)
RECEIPTS_SOAK=1 go test $race -count=1 -p 1 -timeout 6h -v -run "$run" $pkgs 2>&1 | tee "$log" |
	grep -E '^(--- |ok|FAIL|PASS)|^ +(crash|kill|fault|linearizability|model|isolation|hostkill)_test\.go:[0-9]+: '
rc=${PIPESTATUS[0]}
if [ -z "${PGNODES_SKIP:-}" ]; then
	RECEIPTS_SOAK=1 go test $race -count=1 -timeout 2h -v -run '^(TestCrossNode(Pebble|Postgres)|TestFailover(Async)?)$' ./tests/pgnodes 2>&1 | tee -a "$log" |
		grep -E '^(--- |ok|FAIL|PASS)|^ +(harness|failover)_test\.go:[0-9]+: '
	[ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
echo "soak: exit $rc after $(($(date +%s) - start))s; full log in $log" >&2
exit "$rc"
