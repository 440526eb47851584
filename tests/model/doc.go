// Package model is the model-based property test (TestModel): random
// sequences of Claim, Commit, Fail, CommitWith, Release, Renew, Lookup,
// Scan, Count, GC, clock jumps (forward, onto lease and retention
// boundaries, and backwards), reopen and power-loss crash, run against the
// real engine and against an in-memory model of the contract the receipts
// package documents (its doc.go and the README's "What it guarantees": per
// key the fingerprint, state, token, attempts, lease expiry and last
// write). Every outcome is checked field by field.
//
// TestModelSteps (steps_test.go) is the model test of steps (Lease.Step): 3-step actions
// whose steps call a provider that deduplicates by the step's ProviderKey, with a crash, a
// lost reply (the provider's, or PostgreSQL's through a cut proxy), a cancel or NotPerformed
// at any point, on Pebble (a crashable vfs) and PostgreSQL (RECEIPTS_STEPS_CHECKS=n for a
// longer soak).
//
//	go test -run TestModel ./tests/model                  # CI: 1,000 checks (50 under -race)
//	RECEIPTS_SOAK=1 go test -run TestModel ./tests/model  # 100,000 checks
//	go test -run TestModel -rapid.seed=N ./tests/model    # replay one failure
package model
