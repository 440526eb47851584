//go:build !race

package fault_test

// Sizes of the fault harnesses in CI (go test without -race). RECEIPTS_SOAK=1
// runs longer versions.
const (
	faultOps        = 300 // workload ops per k in TestFaultWriteErrorAtK
	faultReadRounds = 20  // rounds of 60 calls per probability in TestFaultRandomReadErrors
)
