//go:build !race

package kill_test

// crashKillCycles is the number of SIGKILL cycles of the child process in
// CI (go test without -race). RECEIPTS_SOAK=1 runs 2,000, and
// RECEIPTS_KILLS=n runs n.
const crashKillCycles = 100
