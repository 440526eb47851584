package model_test

import (
	"testing"

	"github.com/receiptstore/receipts/internal/pgtest"
)

// TestMain fails the package if any test leaves a goroutine running: Close
// must stop everything the store started. It stops the PostgreSQL cluster
// TestModelSteps starts, if it started one.
func TestMain(m *testing.M) {
	pgtest.Main(pgtest.LeakChecked(m))
}
