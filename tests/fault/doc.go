// Package fault holds the I/O fault harnesses, on pebble/v2/vfs/errorfs:
// TestFaultWriteErrorAtK (a write error at every k-th write, on the shared
// workload of tests/internal/workload), TestFaultOpenAtK (the same during
// Open of a crashed store), TestFaultRandomReadErrors (random read errors
// must surface as errors, never as "not found"), TestFaultWALSyncFailStop,
// TestFaultWALSyncDefaultExits and TestFaultReturningFatalfIsFailStop (a
// failed WAL write or sync is fail-stop).
//
// Fail-stop: Pebble cannot go on once a WAL write or sync has failed (it
// may not know what reached the disk), so it calls Logger.Fatalf, in the
// committing goroutine. The store's default logger exits the process
// (status 1) after logging; a restart recovers from what was synced, and
// since a claim or commit is acknowledged only after its sync, nothing
// acknowledged is lost. Applications that set Options.Pebble.Logger take
// over that decision: a Fatalf that returns would let Pebble report the
// failed commit as done. These tests use a logger whose Fatalf panics in
// the calling goroutine, recover the panic, and treat the DB as dead.
//
// CI sizes: 300 workload ops per k and 20 rounds of 60 calls per read-error
// probability (60 and 5 under -race):
//
//	go test -v ./tests/fault
//
// The long version runs 600 ops per k and 200 rounds (scripts/soak.sh runs
// it with the other harnesses); RECEIPTS_SEED=n replays a run:
//
//	RECEIPTS_SOAK=1 go test -v -timeout 6h ./tests/fault
package fault
