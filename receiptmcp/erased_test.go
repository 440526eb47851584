package receiptmcp_test

import (
	"context"
	"testing"

	"github.com/receiptstore/receipts/receiptmcp"
)

// A call in an erased scope (receipts.DB.EraseScope) gets CodeExpired / TypeKeyErased,
// whatever the arguments, and the tool does not run again.
func TestErasedScope(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs, _ := f.session(transports[0], f.serveHTTP())
	key := receiptmcp.NewOperationKey()
	mustCall(t, cs, key, "create_item", map[string]any{"title": "a"})
	if _, err := f.db.EraseScope(context.Background(), "local"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{key, receiptmcp.NewOperationKey()} {
		_, err := call(context.Background(), cs, k, "create_item", map[string]any{"title": "a"})
		wantError(t, err, receiptmcp.CodeExpired, receiptmcp.TypeKeyErased)
	}
	if n := f.runCount("create_item"); n != 1 {
		t.Fatalf("create_item ran %d times, want 1", n)
	}
}
