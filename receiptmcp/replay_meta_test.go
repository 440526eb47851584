package receiptmcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
)

// TestReplayMetaSaysWhenAndHowLong: through the SDK's client, on both
// transports, a replayed result's _meta says when the result was recorded
// and until when the key is protected (RFC 3339, UTC), unchanged as the
// retries go on; the first answer carries neither. isError results too.
func TestReplayMetaSaysWhenAndHowLong(t *testing.T) {
	for _, transport := range transports {
		for _, tool := range []string{"create_item", "fail_item"} {
			t.Run(transport+"/"+tool, func(t *testing.T) {
				f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
				srv := f.serveHTTP()
				cs, scope := f.session(transport, srv)
				key := receiptmcp.NewOperationKey()
				args := map[string]any{"title": "a"}

				f.clk.Advance(1500 * time.Millisecond)
				recorded := f.clk.Now()
				first := mustCall(t, cs, key, tool, args)
				for _, k := range []string{receiptmcp.DefaultReplayMetaKey, receiptmcp.RecordedAtMetaKey, receiptmcp.ExpiresAtMetaKey} {
					if v, ok := first.Meta[k]; ok {
						t.Errorf("first answer has _meta[%q] = %v", k, v)
					}
				}
				rec, err := f.db.Lookup(context.Background(), receipts.Key{Scope: scope, ID: key})
				if err != nil {
					t.Fatal(err)
				}
				if !rec.UpdatedAt.Equal(recorded) {
					t.Fatalf("recorded at %s, want %s", rec.UpdatedAt, recorded)
				}
				for _, later := range []time.Duration{0, time.Hour, 22 * time.Hour} {
					f.clk.Advance(later)
					again := mustCall(t, cs, key, tool, args)
					if !isReplay(again) {
						t.Fatalf("%s: not a replay: %v", later, again.Meta)
					}
					for k, want := range map[string]time.Time{
						receiptmcp.RecordedAtMetaKey: recorded,
						receiptmcp.ExpiresAtMetaKey:  recorded.Add(receipts.DefaultRetention),
					} {
						s, ok := again.Meta[k].(string)
						if !ok {
							t.Fatalf("%s: _meta[%q] = %#v, want a string", later, k, again.Meta[k])
						}
						got, err := time.Parse(time.RFC3339Nano, s)
						if err != nil {
							t.Fatalf("%s: _meta[%q]: %v", later, k, err)
						}
						if !got.Equal(want) || got.Location() != time.UTC {
							t.Errorf("%s: _meta[%q] = %s, want %s", later, k, s, want.Format(time.RFC3339Nano))
						}
					}
				}
				if n := f.runCount(tool); n != 1 {
					t.Fatalf("tool ran %d times", n)
				}
			})
		}
	}
}
