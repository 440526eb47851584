package receiptmcp_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
)

// stepTool is a tool of three steps (reserve, charge, notify). Step
// failStep (1-based) fails with an unknown outcome while failing is set;
// then the tool answers as then says ("ok": a result, "err": an error,
// "isError": an isError result, "rpc": a JSON-RPC error). names overrides
// the step names, for a mismatch.
type stepTool struct {
	runs      [3]atomic.Int32
	recovered [3]atomic.Bool
	keys      [3]atomic.Value
	failStep  int
	failing   atomic.Bool
	then      string
	names     atomic.Pointer[[3]string]
}

func (s *stepTool) handle(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	a, _ := receiptmcp.AttemptFrom(ctx)
	names := [3]string{"reserve", "charge", "notify"}
	if n := s.names.Load(); n != nil {
		names = *n
	}
	var out []string
	for i, name := range names {
		res, err := a.Step(ctx, name, nil, func(ctx context.Context, st *receipts.Step) ([]byte, error) {
			s.runs[i].Add(1)
			s.recovered[i].Store(st.Recovered())
			s.keys[i].Store(st.ProviderKey())
			if s.failStep == i+1 && s.failing.Load() {
				return nil, errors.New("connection reset by the provider")
			}
			return []byte(name + "-done"), nil
		})
		if err != nil {
			switch s.then {
			case "err":
				return nil, err
			case "rpc":
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
			case "isError":
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil
			}
			break
		}
		out = append(out, string(res))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(out, ",")}}}, nil
}

func stepSession(t *testing.T, tool *stepTool) *mcp.ClientSession {
	t.Helper()
	db, _ := openDB(t)
	book := &mcp.Tool{Name: "book_trip", Description: "Books a trip in three steps.", InputSchema: map[string]any{"type": "object"}}
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	s.AddTool(book, tool.handle)
	s.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "alice", Logger: quiet, Policies: receiptmcp.PoliciesFor(book)}))
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

func resultText(res *mcp.CallToolResult) string {
	if res == nil || len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

// TestStepUnknownIsNotRecorded: a step whose outcome is unknown answers
// CodeNotRecorded with data.step, whatever the tool returns after it; the
// retry resumes: finished steps are not run again, and the uncertain one
// runs Recovered with the same provider key.
func TestStepUnknownIsNotRecorded(t *testing.T) {
	for _, then := range []string{"ok", "err", "isError", "rpc"} {
		t.Run(then, func(t *testing.T) {
			tool := &stepTool{failStep: 3, then: then}
			tool.failing.Store(true)
			cs := stepSession(t, tool)
			_, err := call(context.Background(), cs, "k1", "book_trip", map[string]any{})
			d := wantError(t, err, receiptmcp.CodeNotRecorded, receiptmcp.TypeNotRecorded)
			if d.Step != "notify" || d.RetryAfterMs <= 0 {
				t.Fatalf("error data = %+v, want step notify and a retryAfterMs", d)
			}
			key1 := tool.keys[2].Load()
			tool.failing.Store(false)
			res := mustCall(t, cs, "k1", "book_trip", map[string]any{})
			if got := resultText(res); got != "reserve-done,charge-done,notify-done" || res.IsError || isReplay(res) {
				t.Fatalf("retry = %q (isError %v)", got, res.IsError)
			}
			for i, want := range []int32{1, 1, 2} {
				if n := tool.runs[i].Load(); n != want {
					t.Fatalf("step %d ran %d times, want %d", i, n, want)
				}
			}
			if !tool.recovered[2].Load() || tool.keys[2].Load() != key1 {
				t.Fatalf("the uncertain step's retry: recovered %v, key %v (was %v)", tool.recovered[2].Load(), tool.keys[2].Load(), key1)
			}
			if res := mustCall(t, cs, "k1", "book_trip", map[string]any{}); !isReplay(res) {
				t.Fatalf("third call not a replay: %+v", res)
			}
		})
	}
}

// TestStepMismatchIsRefused: a retry whose tool calls another step than
// the journal holds gets TypeStepMismatch naming it, and nothing runs; a
// retry with the recorded steps resumes.
func TestStepMismatchIsRefused(t *testing.T) {
	tool := &stepTool{failStep: 2, then: "ok"}
	tool.failing.Store(true)
	cs := stepSession(t, tool)
	_, err := call(context.Background(), cs, "k1", "book_trip", map[string]any{})
	wantError(t, err, receiptmcp.CodeNotRecorded, receiptmcp.TypeNotRecorded)
	tool.failing.Store(false)
	tool.names.Store(&[3]string{"reserve", "refund", "notify"})
	_, err = call(context.Background(), cs, "k1", "book_trip", map[string]any{})
	if d := wantError(t, err, receiptmcp.CodeInternal, receiptmcp.TypeStepMismatch); d.Step != "refund" {
		t.Fatalf("error data = %+v, want step refund", d)
	}
	if a, b := tool.runs[0].Load(), tool.runs[1].Load(); a != 1 || b != 1 {
		t.Fatalf("runs after the mismatch: %d %d, want 1 1", a, b)
	}
	tool.names.Store(nil)
	mustCall(t, cs, "k1", "book_trip", map[string]any{})
	if a, b, c := tool.runs[0].Load(), tool.runs[1].Load(), tool.runs[2].Load(); a != 1 || b != 2 || c != 1 {
		t.Fatalf("runs after resuming: %d %d %d, want 1 2 1", a, b, c)
	}
}
