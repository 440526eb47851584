package receipts_test

import (
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/tests/measure"
)

// TestMeasureReconcile measures, for the record, Reconciler passes over
// many abandoned claims on a store on disk: their time and the checks they
// made (tests/measure). It runs only with RECEIPTS_MEASURE=1
// (RECEIPTS_MEASURE_N claims, default 10000):
//
//	RECEIPTS_MEASURE=1 go test -run TestMeasureReconcile -v .
func TestMeasureReconcile(t *testing.T) {
	n := measure.Size(t, 10000)
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	measure.Reconcile(t, db, n, 64, []measure.Pass{{Concurrency: 1, Unknown: true}, {Concurrency: 16}})
}
