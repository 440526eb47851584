package isolation_test

import (
	"testing"

	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/receiptstest"
)

// isolationChecks is how many checks the harness runs: the kit's property
// at a harness's size.
func isolationChecks() int {
	switch {
	case testkit.Soak():
		return 200_000
	case testkit.RaceEnabled:
		return 1000
	}
	return 10_000
}

// TestScopeIsolation runs the kit's scope-isolation property
// (receiptstest.ScopeIsolation, the kit's Isolation/Scopes test) on Pebble's
// in-memory FS, at a harness's size.
func TestScopeIsolation(t *testing.T) {
	receiptstest.ScopeIsolation(t, &receiptstest.PebbleStore{Mem: true}, isolationChecks())
}
