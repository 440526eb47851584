package receiptmcp_test

import (
	"context"
	"fmt"
	"os"

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
