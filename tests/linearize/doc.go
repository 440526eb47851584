// Package linearize is the linearizability harness (TestLinearizability):
// 8 clients call Claim, Commit, Fail, Release, Renew and Lookup
// concurrently on a few keys of the real engine; porcupine checks that the
// history is linearizable against a per-key model (absent / leased(token) /
// succeeded(result) / failed(result)). Time is a fake clock that moves only
// between "eras" (all clients pause), so every operation's time is known and
// leases run out (and are taken over) between eras.
//
//	go test -run TestLinearizability ./tests/linearize                 # CI: 100 histories of 8x300 (12 under -race)
//	RECEIPTS_SOAK=1 go test -run TestLinearizability ./tests/linearize # 2,000 histories
package linearize
