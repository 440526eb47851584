// Package bench measures receipts against the least any correct store must do on the same
// engine (raw Pebble: a Get to check absence, a synced claim write, a synced commit write;
// a Get for a replay) and against what users would otherwise use for idempotency keys
// (bbolt, SQLite, PostgreSQL).
//
// It is a separate module so the library's go.mod stays lean. Two entry points:
//
//	go test -run '^$' -bench . -benchmem ./...        # Go benchmarks, each next to its floor
//	go run ./cmd/receiptbench                          # side-by-side table with the peers
//
// Every store runs on disk in a temporary directory: fsync is the cost being measured.
package bench
