package receiptmcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
)

// The middleware's keys are recognised from the store alone (Owns), a
// claim of one settled by hand with SettleResult is replayed by the
// middleware as that result (isError as a Failed receipt), and a Do key is
// not taken for one.
func TestOwnsAndSettleResult(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: -1})
	cs := f.connect(nil)
	ctx := context.Background()
	args := map[string]any{"title": "a"}
	for _, c := range []struct {
		key  string
		res  *mcp.CallToolResult
		want receipts.State
	}{
		{"op-ok", &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "created 7"}}, StructuredContent: map[string]any{"id": 7.0}}, receipts.Succeeded},
		{"op-err", &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "declined"}}, IsError: true}, receipts.Failed},
	} {
		if _, err := call(ctx, cs, c.key, "broken", args); err == nil {
			t.Fatal("the broken tool succeeded")
		}
		k := receipts.Key{Scope: "local", ID: c.key}
		r, err := f.db.Lookup(ctx, k)
		if err != nil || r.State != receipts.Pending || !receiptmcp.Owns(r) {
			t.Fatalf("%s: Lookup = %+v, %v; Owns %v", c.key, r, err, receiptmcp.Owns(r))
		}
		l, err := f.db.TakeOver(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []*mcp.CallToolResult{nil, {InputRequests: mcp.InputRequestMap{"ok": &mcp.ElicitParams{Message: "?"}}}} {
			if _, err := receiptmcp.SettleResult(ctx, l, bad); !errors.Is(err, receiptmcp.ErrInvalidResult) || !errors.Is(err, receipts.ErrInvalidArgument) {
				t.Fatalf("SettleResult(%+v): %v, want ErrInvalidResult", bad, err)
			}
		}
		if got, err := f.db.Lookup(ctx, k); err != nil || got.State != receipts.Pending || got.Token != l.Token() {
			t.Fatalf("a refused SettleResult wrote: %+v, %v", got, err)
		}
		rec, err := receiptmcp.SettleResult(ctx, l, c.res)
		if err != nil || rec.State != c.want {
			t.Fatalf("SettleResult = %+v, %v", rec, err)
		}
		got := mustCall(t, cs, c.key, "broken", args)
		if !isReplay(got) || got.IsError != c.res.IsError {
			t.Fatalf("the retry after settling: %+v", got)
		}
		if text := got.Content[0].(*mcp.TextContent).Text; len(got.Content) != 1 || text != c.res.Content[0].(*mcp.TextContent).Text {
			t.Fatalf("replayed content %+v, want %+v", got.Content, c.res.Content)
		}
		wantSC, _ := json.Marshal(c.res.StructuredContent)
		if b, _ := json.Marshal(got.StructuredContent); string(b) != string(wantSC) {
			t.Fatalf("replayed structured content %s, want %s", b, wantSC)
		}
	}
	if n := f.runCount("broken"); n != 2 {
		t.Fatalf("the tool ran %d times, want 2 (once per key)", n)
	}
	do, err := f.db.Do(ctx, receipts.Key{Scope: "local", ID: "do"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("x"), nil })
	if err != nil || receiptmcp.Owns(do) || receiptmcp.Owns(nil) {
		t.Fatalf("Owns of a Do receipt: %v %v", receiptmcp.Owns(do), err)
	}
}

// A key stored by a receiptmcp that did not mark its fingerprints is still
// matched: its receipt is replayed, other arguments still conflict.
func TestUnmarkedFingerprintStillMatches(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: -1})
	cs := f.connect(nil)
	ctx := context.Background()
	fp, err := receiptmcp.Fingerprint("create_item", json.RawMessage(`{"title":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	unmarked := fp[len(fp)-32:] // the SHA-256 the mark precedes
	k := receipts.Key{Scope: "local", ID: "old"}
	l, _, err := f.db.Claim(ctx, k, unmarked)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := receiptmcp.EncodeResult(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "made before the upgrade"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(ctx, stored); err != nil {
		t.Fatal(err)
	}
	got := mustCall(t, cs, "old", "create_item", map[string]any{"title": "a"})
	if !isReplay(got) || len(got.Content) != 1 || got.Content[0].(*mcp.TextContent).Text != "made before the upgrade" {
		t.Fatalf("retry of an unmarked key: %+v", got)
	}
	_, err = call(ctx, cs, "old", "create_item", map[string]any{"title": "b"})
	wantError(t, err, receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyConflict)
	if n := f.runCount("create_item"); n != 0 {
		t.Fatalf("the tool ran %d times, want 0", n)
	}
	if rec, _ := f.db.Lookup(ctx, k); receiptmcp.Owns(rec) {
		t.Fatal("Owns recognised an unmarked key")
	}
}
