package receiptmcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
)

// A host calls a tool twice with the same operation key, as it would after
// a timeout: the tool runs once and the retry gets the stored result.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "receiptmcp-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, &receipts.Options{Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer db.Close()

	// Server: a tool with an effect, behind the middleware.
	type in struct {
		Title string `json:"title"`
	}
	type out struct {
		ID int `json:"id"`
	}
	created := 0
	server := mcp.NewServer(&mcp.Implementation{Name: "workitems", Version: "v1"}, nil)
	createTool := &mcp.Tool{Name: "create_work_item", Description: "Create a work item."}
	mcp.AddTool(server, createTool, func(ctx context.Context, req *mcp.CallToolRequest, args in) (*mcp.CallToolResult, out, error) {
		created++
		return nil, out{ID: created}, nil
	})
	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{
		Policies:   receiptmcp.PoliciesFor(createTool), // no annotations: key required
		FixedScope: "local-user",                       // stdio-like transport: no token
	}))

	// Host: the key is minted once, when the action is approved.
	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		panic(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v1"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		panic(err)
	}
	defer ss.Wait()
	defer cs.Close()

	approved := receiptmcp.WithOperationKey(ctx, receiptmcp.NewOperationKey())
	for attempt := 1; attempt <= 2; attempt++ {
		res, err := cs.CallTool(approved, &mcp.CallToolParams{
			Name:      "create_work_item",
			Arguments: map[string]any{"title": "Fix the login page"},
		})
		if err != nil {
			panic(err)
		}
		fmt.Printf("attempt %d: %s replayed=%v\n", attempt,
			res.Content[0].(*mcp.TextContent).Text, res.Meta[receiptmcp.DefaultReplayMetaKey] == true)
	}
	fmt.Println("work items created:", created)
	// Output:
	// attempt 1: {"id":1} replayed=false
	// attempt 2: {"id":1} replayed=true
	// work items created: 1
}

// fencedTable stands for a downstream system (a table in another database):
// each row keeps the largest fencing token that wrote it, and a write with
// a token that is not larger changes nothing. In SQL:
//
//	UPDATE work_items SET title = $1, fence = $2 WHERE id = $3 AND fence < $2
type fencedTable struct {
	mu   sync.Mutex
	rows map[string]fencedRow
}

type fencedRow struct {
	title string
	fence uint64
}

// write sets row id to title if token is larger than the row's fence, and
// reports whether it did.
func (t *fencedTable) write(id, title string, token uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rows[id].fence >= token {
		return false // a newer attempt has written: this one is stale
	}
	t.rows[id] = fencedRow{title: title, fence: token}
	return true
}

// A tool fences its writes to another system with Attempt.Token: the first
// attempt writes and then fails in a way that leaves its outcome unknown
// (its claim is abandoned); the retry takes the claim over with a larger
// token and writes again; when the first attempt's write arrives late, it
// changes nothing.
func ExampleAttempt() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "receiptmcp-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, &receipts.Options{Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer db.Close()

	table := &fencedTable{rows: map[string]fencedRow{}}
	var late func() bool // the first attempt's write, delivered late
	server := mcp.NewServer(&mcp.Implementation{Name: "workitems", Version: "v1"}, &mcp.ServerOptions{Logger: quiet})
	tool := &mcp.Tool{Name: "rename_work_item", InputSchema: json.RawMessage(`{"type":"object"}`)}
	server.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		a, _ := receiptmcp.AttemptFrom(ctx)
		title := fmt.Sprintf("written by attempt %d", a.Number)
		if !table.write("wi_1", title, a.Token) {
			return nil, &jsonrpc.Error{Code: -32001, Message: "stale attempt"}
		}
		if a.Number == 1 {
			late = func() bool { return table.write("wi_1", "late write of attempt 1", a.Token) }
			return nil, errors.New("upstream timed out") // outcome unknown
		}
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: fmt.Sprintf("renamed (recovered=%v)", a.Recovered)},
		}}, nil
	})
	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{
		Policies:   receiptmcp.PoliciesFor(tool),
		FixedScope: "local-user",
	}))

	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		panic(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v1"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		panic(err)
	}
	defer ss.Wait()
	defer cs.Close()

	approved := receiptmcp.WithOperationKey(ctx, receiptmcp.NewOperationKey())
	for attempt := 1; attempt <= 2; attempt++ {
		res, err := cs.CallTool(approved, &mcp.CallToolParams{Name: "rename_work_item", Arguments: map[string]any{}})
		if err != nil {
			fmt.Printf("attempt %d: error\n", attempt)
			continue
		}
		fmt.Printf("attempt %d: %s\n", attempt, res.Content[0].(*mcp.TextContent).Text)
	}
	fmt.Println("late write applied:", late())
	fmt.Println("row:", table.rows["wi_1"].title)
	// Output:
	// attempt 1: error
	// attempt 2: renamed (recovered=true)
	// late write applied: false
	// row: written by attempt 2
}
