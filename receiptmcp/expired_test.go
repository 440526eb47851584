package receiptmcp_test

import (
	"context"
	"testing"

	"github.com/receiptstore/receipts/receiptmcp"
)

// A call after the receipt's retention, within the tombstone window, gets
// CodeExpired / TypeKeyExpired, whatever the arguments, and the tool does
// not run again.
func TestExpiredKey(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs, _ := f.session(transports[0], f.serveHTTP())
	key := receiptmcp.NewOperationKey()
	mustCall(t, cs, key, "create_item", map[string]any{"title": "a"})
	f.clk.Advance(f.db.Options().Retention)
	for _, title := range []string{"a", "other"} {
		_, err := call(context.Background(), cs, key, "create_item", map[string]any{"title": title})
		data := wantError(t, err, receiptmcp.CodeExpired, receiptmcp.TypeKeyExpired)
		if data.Tool != "create_item" || data.MetaKey != receiptmcp.DefaultMetaKey {
			t.Errorf("data = %+v", data)
		}
	}
	if n := f.runCount("create_item"); n != 1 {
		t.Fatalf("create_item ran %d times, want 1", n)
	}
}
