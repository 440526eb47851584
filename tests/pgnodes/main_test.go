package pgnodes

import (
	"testing"

	"github.com/receiptstore/receipts/internal/pgtest"
)

// TestMain stops the throwaway PostgreSQL cluster, if a test started one. Node processes (this
// binary re-executed) run only TestNodeChild and never start one.
func TestMain(m *testing.M) { pgtest.Main(m) }
