package receipts_test

import (
	"testing"

	"github.com/receiptstore/receipts/receiptstest"
)

// TestConformance runs the contract kit (package receiptstest) on the
// Pebble engine, on disk and on Pebble's in-memory FS.
//
//	go test -run 'TestConformance/mem/Lease/' .
func TestConformance(t *testing.T) {
	t.Run("disk", func(t *testing.T) { receiptstest.Run(t, &receiptstest.PebbleStore{}) })
	t.Run("mem", func(t *testing.T) { receiptstest.Run(t, &receiptstest.PebbleStore{Mem: true}) })
}
