package receiptmcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptmcp"
)

// sep3182Server serves a "create" tool that counts its runs, over
// stateless streamable HTTP, behind the middleware; wrap says whether the
// handler is wrapped with AcceptIdempotencyKeyParam.
func sep3182Server(t *testing.T, wrap bool) (url string, runs *atomic.Int64) {
	t.Helper()
	db, err := pebblestore.Open("s", &pebblestore.Options{Options: receipts.Options{GCInterval: -1}, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	if err != nil {
		t.Fatal(err)
	}
	runs = new(atomic.Int64)
	server := mcp.NewServer(&mcp.Implementation{Name: "s"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "create"}, func(context.Context, *mcp.CallToolRequest, struct {
		Title string `json:"title"`
	}) (*mcp.CallToolResult, any, error) {
		n := runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "run " + string(rune('0'+n))}}}, nil, nil
	})
	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "local"}))
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	if wrap {
		h = receiptmcp.AcceptIdempotencyKeyParam(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return srv.URL, runs
}

type rpcReply struct {
	Result *mcp.CallToolResult `json:"result"`
	Error  *struct {
		Code    int64                `json:"code"`
		Message string               `json:"message"`
		Data    receiptmcp.ErrorData `json:"data"`
	} `json:"error"`
}

// rawCall posts one tools/call with params as given, as a client of the
// closed proposal would send it.
func rawCall(t *testing.T, url, params string) rpcReply {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + params + `}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r rpcReply
	if err := json.Unmarshal(bytes.TrimSpace(b), &r); err != nil {
		t.Fatalf("%s: %s: %v", resp.Status, b, err)
	}
	return r
}

func TestIdempotencyKeyParam(t *testing.T) {
	url, runs := sep3182Server(t, true)
	first := rawCall(t, url, `{"name":"create","arguments":{"title":"a"},"idempotencyKey":"k-1"}`)
	again := rawCall(t, url, `{"name":"create","arguments":{"title":"a"},"idempotencyKey":"k-1"}`)
	if first.Error != nil || again.Error != nil || runs.Load() != 1 {
		t.Fatalf("two calls with params.idempotencyKey k-1: %+v, %+v, %d runs (want 1)", first.Error, again.Error, runs.Load())
	}
	if again.Result.Meta[receiptmcp.DefaultReplayMetaKey] != true {
		t.Fatalf("the second call was not replayed: %+v", again.Result.Meta)
	}
	// The same key in _meta: the same operation.
	meta := rawCall(t, url, `{"name":"create","arguments":{"title":"a"},"_meta":{"dev.receipts/operationKey":"k-1"}}`)
	both := rawCall(t, url, `{"name":"create","arguments":{"title":"a"},"idempotencyKey":"k-1","_meta":{"dev.receipts/operationKey":"k-1"}}`)
	if meta.Error != nil || both.Error != nil || runs.Load() != 1 {
		t.Fatalf("k-1 in _meta, and in both: %+v, %+v, %d runs (want 1)", meta.Error, both.Error, runs.Load())
	}
	// Two different keys: refused, nothing runs.
	differ := rawCall(t, url, `{"name":"create","arguments":{"title":"b"},"idempotencyKey":"k-2","_meta":{"dev.receipts/operationKey":"k-3"}}`)
	if differ.Error == nil || differ.Error.Code != receiptmcp.CodeInvalidParams || differ.Error.Data.Type != receiptmcp.TypeKeyInvalid {
		t.Fatalf("two different keys: %+v", differ)
	}
	bad := rawCall(t, url, `{"name":"create","arguments":{"title":"b"},"idempotencyKey":7}`)
	if bad.Error == nil || bad.Error.Data.Type != receiptmcp.TypeKeyInvalid {
		t.Fatalf("a number as the key: %+v", bad)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs after the refused calls, want 1", runs.Load())
	}
}

// TestIdempotencyKeyParamUnwrapped shows why the wrapper exists: the SDK
// drops params.idempotencyKey before any middleware runs, so without it
// each call runs.
func TestIdempotencyKeyParamUnwrapped(t *testing.T) {
	url, runs := sep3182Server(t, false)
	for range 2 {
		if r := rawCall(t, url, `{"name":"create","arguments":{"title":"a"},"idempotencyKey":"k-1"}`); r.Error != nil {
			t.Fatal(r.Error)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2: the SDK let the middleware see params.idempotencyKey; simplify", runs.Load())
	}
}

// TestIdempotencyKeyParamTransport: the same through a transport the
// server is connected to (in memory here; stdio in practice), with a raw
// client connection that writes the messages a SEP-3182 client sends.
func TestIdempotencyKeyParamTransport(t *testing.T) {
	ctx := context.Background()
	db, err := pebblestore.Open("s", &pebblestore.Options{Options: receipts.Options{GCInterval: -1}, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var runs atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "s"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "create"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "local"}))
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, receiptmcp.AcceptIdempotencyKeyParamTransport(st), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	conn, err := ct.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip := func(id int64, method, params string) *jsonrpc.Response {
		t.Helper()
		rid, _ := jsonrpc.MakeID(float64(id))
		if err := conn.Write(ctx, &jsonrpc.Request{ID: rid, Method: method, Params: json.RawMessage(params)}); err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := conn.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r, ok := msg.(*jsonrpc.Response); ok {
				return r
			}
		}
	}
	roundTrip(1, "initialize", `{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}`)
	_ = conn.Write(ctx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)})
	for i := range 2 {
		if r := roundTrip(int64(2+i), "tools/call", `{"name":"create","arguments":{},"idempotencyKey":"k-1"}`); r.Error != nil {
			t.Fatal(r.Error)
		}
	}
	if r := roundTrip(4, "tools/call", `{"name":"create","arguments":{},"idempotencyKey":"k-1","_meta":{"dev.receipts/operationKey":"k-9"}}`); r.Error == nil {
		t.Fatal("two different keys were accepted")
	}
	// One key written two ways (issue 43, item 6): the replay of k-1.
	if r := roundTrip(5, "tools/call", `{"name":"create","arguments":{},"idempotencyKey":"k-\u0031","_meta":{"dev.receipts/idempotencyKey":"k-1"}}`); r.Error != nil {
		t.Fatalf("one key written two ways: %v", r.Error)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
}

// TestIdempotencyKeyParamSpelledTwoWays (issue 43, item 6): one key written two ways in JSON
// ("k-1" in params.idempotencyKey, "k-\u0031" in params._meta[ParamsKeyMetaKey]) is one key:
// the call runs, and a retry with either spelling is its replay. Two different keys there are
// refused with an error that names what the client sent (params.idempotencyKey and that
// entry), not the middleware's own _meta entry, and no Go type.
func TestIdempotencyKeyParamSpelledTwoWays(t *testing.T) {
	url, runs := sep3182Server(t, true)
	first := rawCall(t, url, `{"name":"create","arguments":{"title":"a"},"idempotencyKey":"k-1","_meta":{"dev.receipts/idempotencyKey":"k-\u0031"}}`)
	if first.Error != nil || runs.Load() != 1 {
		t.Fatalf(`"k-1" and "k-\u0031": %+v, %d runs (want 1)`, first.Error, runs.Load())
	}
	for _, params := range []string{
		`{"name":"create","arguments":{"title":"a"},"idempotencyKey":"k-\u0031"}`,
		`{"name":"create","arguments":{"title":"a"},"_meta":{"dev.receipts/operationKey":"k-1"}}`,
	} {
		again := rawCall(t, url, params)
		if again.Error != nil || again.Result.Meta[receiptmcp.DefaultReplayMetaKey] != true || runs.Load() != 1 {
			t.Fatalf("%s: %+v %+v, %d runs; want the replay", params, again.Error, again.Result, runs.Load())
		}
	}

	differ := rawCall(t, url, `{"name":"create","arguments":{"title":"b"},"idempotencyKey":"k-2","_meta":{"dev.receipts/idempotencyKey":"k-3"}}`)
	if differ.Error == nil || differ.Error.Code != receiptmcp.CodeInvalidParams || differ.Error.Data.Type != receiptmcp.TypeKeyInvalid {
		t.Fatalf("two different keys: %+v", differ)
	}
	msg := differ.Error.Message
	if !strings.Contains(msg, "params.idempotencyKey") || !strings.Contains(msg, receiptmcp.ParamsKeyMetaKey) || !strings.Contains(msg, "different keys") ||
		strings.Contains(msg, "operationKey") || strings.Contains(msg, "interface") || differ.Error.Data.MetaKey != receiptmcp.ParamsKeyMetaKey {
		t.Fatalf("two different keys: %q (data %+v); want it to name params.idempotencyKey and %s, and nothing the client did not send", msg, differ.Error.Data, receiptmcp.ParamsKeyMetaKey)
	}
	bad := rawCall(t, url, `{"name":"create","arguments":{"title":"b"},"idempotencyKey":7}`)
	if bad.Error == nil || !strings.Contains(bad.Error.Message, "got a number") || !strings.Contains(bad.Error.Message, "params.idempotencyKey") {
		t.Fatalf("a number as the key: %+v", bad.Error)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs after the refused calls, want 1", runs.Load())
	}
}
