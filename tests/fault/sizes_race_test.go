//go:build race

package fault_test

// Under -race the harnesses run smaller (the race detector slows them down
// about tenfold); the full CI sizes run without -race.
const (
	faultOps        = 60 // workload ops per k in TestFaultWriteErrorAtK
	faultReadRounds = 5  // rounds of 60 calls per probability in TestFaultRandomReadErrors
)
