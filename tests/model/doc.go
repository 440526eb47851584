// Package model is the model-based property test (TestModel): random
// sequences of Claim, Commit, Fail, CommitWith, Release, Renew, Lookup,
// Scan, Count, GC, clock jumps (forward, onto lease and retention
// boundaries, and backwards), reopen and power-loss crash, run against the
// real engine and against an in-memory model of the contract the receipts
// package documents (its doc.go and the README's "What it guarantees": per
// key the fingerprint, state, token, attempts, lease expiry and last
// write). Every outcome is checked field by field.
//
//	go test -run TestModel ./tests/model                  # CI: 1,000 checks (50 under -race)
//	RECEIPTS_SOAK=1 go test -run TestModel ./tests/model  # 100,000 checks
//	go test -run TestModel -rapid.seed=N ./tests/model    # replay one failure
package model
