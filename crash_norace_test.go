//go:build !race

package receipts_test

// Sizes of the crash harnesses in CI (go test without -race). RECEIPTS_SOAK=1
// and the RECEIPTS_CRASHES / RECEIPTS_KILLS knobs run longer versions.
const (
	faultOps        = 300 // workload ops per k in TestFaultWriteErrorAtK
	faultReadRounds = 20  // rounds of 60 calls per probability in TestFaultRandomReadErrors
)
