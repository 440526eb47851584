package receiptmcp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
)

// TestPanickingStagedEffectAbandonsClaim (issue 43, item 2): a tool's staged effect
// (Attempt.Stage) that panics while the call's result is recorded abandons the claim at
// once: the panic reaches the middleware outside receiptmcp's (here one that recovers it, as
// a server would), and the client's retry runs right away, Recovered, instead of being
// answered "in progress" for a whole lease. Over the SDK's client and in-memory transport.
func TestPanickingStagedEffectAbandonsClaim(t *testing.T) {
	db, _ := openDB(t)
	tool := &mcp.Tool{Name: "pay", Description: "Pays."}
	var mu sync.Mutex
	explode := true
	var attempts []seen
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	mcp.AddTool(s, tool, func(ctx context.Context, _ *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, itemOut, error) {
		a, _ := receiptmcp.AttemptFrom(ctx)
		mu.Lock()
		attempts = append(attempts, seen{OK: true, Number: a.Number, Recovered: a.Recovered})
		boom := explode
		mu.Unlock()
		a.Stage(receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error {
			if boom {
				panic("effect exploded")
			}
			return b.Set([]byte("app/"+a.Key.ID), []byte("paid"), nil)
		}))
		return nil, itemOut{ID: 1, Title: in.Title}, nil
	})
	s.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "local", Policies: receiptmcp.PoliciesFor(tool), Logger: quiet}))
	var recovered []any
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler { // outermost
		return func(ctx context.Context, method string, req mcp.Request) (res mcp.Result, err error) {
			defer func() {
				if p := recover(); p != nil {
					mu.Lock()
					recovered = append(recovered, p)
					mu.Unlock()
					res, err = nil, fmt.Errorf("internal error: %v", p)
				}
			}()
			return next(ctx, method, req)
		}
	})

	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close(); _ = ss.Wait() })

	key := receiptmcp.NewOperationKey()
	args := map[string]any{"title": "invoice 7"}
	if _, err := call(context.Background(), cs, key, "pay", args); err == nil {
		t.Fatal("the first call succeeded; its effect panicked")
	}
	mu.Lock()
	if len(recovered) != 1 || recovered[0] != "effect exploded" {
		t.Fatalf("the server's middleware recovered %v, want the effect's panic", recovered)
	}
	explode = false
	mu.Unlock()

	res := mustCall(t, cs, key, "pay", args) // the retry, right away: it runs, recovered
	if res.IsError {
		t.Fatalf("the retry: %+v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 2 || attempts[1].Number != 2 || !attempts[1].Recovered {
		t.Fatalf("attempts %+v, want a second, Recovered", attempts)
	}
}
