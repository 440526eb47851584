// Package kill is the process-crash harness (TestKillProcess): the test
// binary starts itself again as a child (TestKillProcessChild) that opens a
// store on disk and runs the shared 8-way workload (tests/internal/workload);
// effects go to a provider log fsynced before the holder commits. The parent
// SIGKILLs the child at a random moment and starts it again; each child
// first checks the store it finds against the logs of acknowledged events
// and effects, and the parent checks once more at the end: no duplicate
// effects, no lost acknowledged receipts.
//
// CI runs 100 kill cycles (20 under -race):
//
//	go test -run 'TestKillProcess$' -v ./tests/kill
//
// The long version runs 2,000 (scripts/soak.sh runs it with the other
// harnesses):
//
//	RECEIPTS_SOAK=1 go test -run 'TestKillProcess$' -v -timeout 6h ./tests/kill
//
// RECEIPTS_KILLS=n sets the count and RECEIPTS_SEED=n replays a run's
// choices (every run logs its seed).
package kill
