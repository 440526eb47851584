// Package tests holds the long reliability harnesses of the Pebble
// engine, one package each, and the mutation check that shows each of them
// failing when the engine is broken on purpose:
//
//   - crash: power loss (Pebble's crashable in-memory FS, crash images)
//   - hostkill: the host half (package intents) and the service half
//     (receipthttp, receiptmcp) in processes SIGKILLed at random, on Pebble
//     and PostgreSQL
//   - fault: I/O faults (errorfs: write errors at every k, random read
//     errors, fail-stop on a failed WAL write or sync)
//   - isolation: adversarial scopes and IDs never reach each other
//   - kill: process crashes (SIGKILL of a re-executed child on disk)
//   - linearize: porcupine checks concurrent histories per key
//   - model: a rapid state machine against an in-memory model of the contract
//   - workload: the workload and checker the crash harnesses share
//
// Each package's doc says what its harness proves and how to run it. Every
// harness runs its CI size under plain go test (smaller under -race) and its
// long version with RECEIPTS_SOAK=1 (scripts/soak.sh runs them all).
//
// TestMutationCheck builds each harness package with -tags receipts_mutate
// (internal/mutate), runs every harness unmutated and under every mutation,
// logs the table and fails if some mutation survives every harness. It
// takes a few minutes and runs only when asked:
//
//	RECEIPTS_MUTATION_CHECK=1 go test -run TestMutationCheck -v ./tests
//
// scripts/mutation-check.sh is the same check at CI sizes, as a table.
package tests
