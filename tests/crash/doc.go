// Package crash is the power-loss harness (TestCrashPowerLoss): 8 workers
// run the shared workload (tests/internal/workload) on Pebble's crashable
// in-memory FS; at a random moment the harness takes a crash image
// (vfs.CrashClone), reopens it and checks it against everything that was
// acknowledged before the crash: no duplicate effects, no lost acknowledged
// receipts, no lost claims, no token going backwards, no undecodable record.
// Mode "p0" keeps exactly the synced data; "prand" keeps a seeded random
// 10..100% of the unsynced data. After the last crash every acknowledged
// receipt must leave a tombstone past its retention.
//
// CI runs 60 crashes per mode (25 under -race):
//
//	go test -run TestCrashPowerLoss -v ./tests/crash
//
// The long version runs 2,000 per mode (scripts/soak.sh runs it with the
// other harnesses):
//
//	RECEIPTS_SOAK=1 go test -run TestCrashPowerLoss -v -timeout 6h ./tests/crash
//
// RECEIPTS_CRASHES=n sets the count, RECEIPTS_SEED=n replays a run (every
// run logs its seed), and scripts/mutation-check.sh shows the harness
// failing when the engine is broken on purpose.
package crash
