//go:build receipts_nopebble

package main

import (
	"fmt"

	"github.com/receiptstore/receipts"
)

// newPebbleItems fails: a build with -tags receipts_nopebble links no
// Pebble, and keeps its store and its items on PostgreSQL (-pg). The store
// never gets this far: receipts.Open has already returned ErrUnsupported.
func newPebbleItems(*receipts.DB) (items, error) {
	return nil, fmt.Errorf("%w: work items on Pebble in a build with -tags receipts_nopebble; give -pg", receipts.ErrUnsupported)
}
