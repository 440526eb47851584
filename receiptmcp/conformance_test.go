package receiptmcp_test

import (
	"testing"

	"github.com/receiptstore/receipts/receiptstest"
)

// TestConformance runs the kit's MCP front-end suite (receiptstest.RunMCP)
// on the Pebble engine, on Pebble's in-memory FS: two servers on one store.
// pgstore's TestFrontEnds runs it on PostgreSQL with two nodes.
//
//	go test -run 'TestConformance/' ./receiptmcp
func TestConformance(t *testing.T) {
	receiptstest.RunMCP(t, &receiptstest.PebbleStore{Mem: true})
}
