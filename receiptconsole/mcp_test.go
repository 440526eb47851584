package receiptconsole_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/receiptstore/receipts/receiptmcp"
	"github.com/stretchr/testify/require"
)

// mcpService is an MCP server whose tool create_item goes through receiptmcp, and a host's
// client session to it. The tool fails with an unknown outcome while fail is set.
type mcpService struct {
	session *mcp.ClientSession
	runs    atomic.Int32
	fail    atomic.Bool
}

func newMCPService(t *testing.T, db *receipts.DB) *mcpService {
	t.Helper()
	s := &mcpService{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "svc", Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	tool := &mcp.Tool{Name: "create_item", InputSchema: json.RawMessage(`{"type":"object"}`)}
	srv.AddTool(tool, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.runs.Add(1)
		if s.fail.Load() {
			return nil, errors.New("connection reset while writing")
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "created by the tool"}}}, nil
	})
	srv.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "agent", Wait: -1, Logger: quiet,
		Policies: receiptmcp.PoliciesFor(tool)}))
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(bg, st, nil)
	require.NoError(t, err)
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	s.session, err = client.Connect(bg, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.session.Close()
		_ = ss.Wait()
	})
	return s
}

func (s *mcpService) call(key string) (*mcp.CallToolResult, error) {
	ctx := receiptmcp.WithOperationKey(bg, key)
	return s.session.CallTool(ctx, &mcp.CallToolParams{Name: "create_item", Arguments: map[string]any{"title": "a"}})
}

// A receiptmcp claim is settled with a tool result: a result that is not one is refused
// on the page, and a real retry of the tool call then gets the settled result, replayed,
// without running the tool.
func TestSettleMCPFace(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			db := e.open(t, nil)
			svc := newMCPService(t, db)
			svc.fail.Store(true)
			_, err := svc.call("op-mcp")
			require.Error(t, err)
			svc.fail.Store(false)
			cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
			needs := cs.get(t, "needs")
			require.Contains(t, text(needs.doc), "MCP (receiptmcp)")
			sp := cs.get(t, needs.rowLink(t, "op-mcp", "Settle"))
			checkPage(t, sp, false)
			form := sp.form(t, "settle")
			require.Equal(t, "mcp", form.Get("outcome"))
			form.Set("confirm", "op-mcp")
			form.Set("result", "not json")
			p := cs.post(t, "settle", form, nil)
			require.Equal(t, http.StatusBadRequest, p.status)
			require.Contains(t, text(p.doc), "not a tool result")
			require.Len(t, abandoned(t, db), 1)

			form.Set("result", `{"content":[{"type":"text","text":"created 7"}],"structuredContent":{"id":7}}`)
			p = cs.post(t, "settle", form, nil)
			require.Equal(t, http.StatusSeeOther, p.status, p.body)
			runs := svc.runs.Load()
			res, err := svc.call("op-mcp")
			require.NoError(t, err)
			require.Equal(t, true, res.Meta[receiptmcp.DefaultReplayMetaKey])
			require.Len(t, res.Content, 1)
			require.Equal(t, "created 7", res.Content[0].(*mcp.TextContent).Text)
			require.Equal(t, runs, svc.runs.Load(), "the retry ran the tool again")
		})
	}
}
