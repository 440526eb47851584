package receipthttp_test

import (
	"testing"

	"github.com/receiptstore/receipts/receiptstest"
)

// TestConformance runs the kit's HTTP front-end suite (receiptstest.RunHTTP)
// on the Pebble engine, on Pebble's in-memory FS: two servers on one store.
// pgstore's TestFrontEnds runs it on PostgreSQL with two nodes.
//
//	go test -run 'TestConformance/' ./receipthttp
func TestConformance(t *testing.T) {
	receiptstest.RunHTTP(t, &receiptstest.PebbleStore{Mem: true})
}
