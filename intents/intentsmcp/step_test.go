package intentsmcp_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentsmcp"
	"github.com/receiptstore/receipts/receiptmcp"
)

// TestUncertainStep: an MCP error whose data names the step of the
// service's action that was uncertain ("step") makes the uncertain action
// say which step it was (Action.UncertainStep), for receiptmcp's
// outcome-not-recorded error and for another internal error alike; data
// without a step string names none.
func TestUncertainStep(t *testing.T) {
	for _, c := range []struct {
		name string
		code int64
		data string
		want string
	}{
		{"not recorded", receiptmcp.CodeNotRecorded, `{"type":"idempotency_outcome_not_recorded","tool":"book_trip","retryAfterMs":5,"step":"charge"}`, "charge"},
		{"internal", jsonrpc.CodeInternalError, `{"step":"send itinerary"}`, "send itinerary"},
		{"no step", receiptmcp.CodeNotRecorded, `{"type":"idempotency_outcome_not_recorded","retryAfterMs":5}`, ""},
		{"not a string", jsonrpc.CodeInternalError, `{"step":3}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := mcp.NewServer(&mcp.Implementation{Name: "svc", Version: "v0"}, nil)
			srv.AddTool(&mcp.Tool{Name: "book_trip", InputSchema: json.RawMessage(`{"type":"object"}`)},
				func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return &mcp.CallToolResult{}, nil
				})
			srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
				return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
					if method != "tools/call" {
						return next(ctx, method, req)
					}
					calls.Add(1)
					return nil, &jsonrpc.Error{Code: c.code, Message: "the outcome is unknown", Data: json.RawMessage(c.data)}
				}
			})
			var sessions []*mcp.ServerSession
			client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
			tr := intentsmcp.New(func(ctx context.Context) (*mcp.ClientSession, error) {
				st, ct := mcp.NewInMemoryTransports()
				ss, err := srv.Connect(ctx, st, nil)
				if err != nil {
					return nil, err
				}
				sessions = append(sessions, ss)
				return client.Connect(ctx, ct, nil)
			}, nil)
			j, err := intents.Open("host", &intents.Options{Pebble: &pebble.Options{FS: vfs.NewMem()}, PollInterval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			d, err := intents.NewDispatcher(j, intents.DispatcherOptions{Transports: map[string]intents.Transport{"trips": tr},
				MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = d.Close()
				_ = tr.Close()
				for _, ss := range sessions {
					_ = ss.Close()
				}
				_ = j.Close()
			}()
			ctx := context.Background()
			a, err := j.Approve(ctx, intents.Approval{Target: "trips", Operation: "book_trip", ApprovedBy: "alice",
				Deadline: time.Now().Add(300 * time.Millisecond)})
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			got, err := j.Wait(wctx, a.Key)
			if err != nil || got.State != intents.Uncertain || calls.Load() < 2 {
				t.Fatalf("%+v, %v (%d calls)", got, err, calls.Load())
			}
			if got.UncertainStep != c.want {
				t.Fatalf("UncertainStep = %q, want %q (%s)", got.UncertainStep, c.want, got.LastError)
			}
		})
	}
}
