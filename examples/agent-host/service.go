package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
)

// travel is the tool service: an MCP server whose tools are behind
// receiptmcp on a receipts store, so each operation key runs once. Its
// effects (a booking, a charge, an email) are kept in a list: the
// service's own log, which the summary counts.
type travel struct {
	db  *receipts.DB
	srv *http.Server
	url string

	mu      sync.Mutex
	effects []effect
	// holdAfter names a tool whose next call, once its effect is done,
	// reports on effected and waits for release before it answers.
	holdAfter string
	effected  chan string
	release   chan struct{}
}

type effect struct{ tool, key, what string }

type flightIn struct {
	Flight string `json:"flight"`
	Date   string `json:"date"`
}

type chargeIn struct {
	AmountCents int    `json:"amount_cents"`
	Currency    string `json:"currency"`
}

type emailIn struct {
	To       string `json:"to"`
	Template string `json:"template"`
}

type out struct {
	Ref string `json:"ref"`
}

func startTravel(dir string) (*travel, error) {
	db, err := receipts.Open(filepath.Join(dir, "service"), nil)
	if err != nil {
		return nil, err
	}
	t := &travel{db: db, effected: make(chan string, 1), release: make(chan struct{})}
	server := mcp.NewServer(&mcp.Implementation{Name: "travel"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "book_flight"}, func(ctx context.Context, _ *mcp.CallToolRequest, in flightIn) (*mcp.CallToolResult, out, error) {
		return nil, out{t.do(ctx, "book_flight", fmt.Sprintf("booked %s on %s", in.Flight, in.Date), "BK")}, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "charge_card"}, func(ctx context.Context, _ *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, out, error) {
		return nil, out{t.do(ctx, "charge_card", fmt.Sprintf("charged %d %s", in.AmountCents, in.Currency), "CH")}, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "send_email"}, func(ctx context.Context, _ *mcp.CallToolRequest, in emailIn) (*mcp.CallToolResult, out, error) {
		return nil, out{t.do(ctx, "send_email", fmt.Sprintf("emailed the %s to %s", in.Template, in.To), "EM")}, nil
	})
	// Every tool needs an operation key; the one local caller is the
	// scope (a service with callers of its own would scope by their
	// bearer tokens, see receiptmcp).
	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "agent-host", Default: receiptmcp.Required}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	t.url = "http://" + ln.Addr().String()
	t.srv = &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)}
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

// do performs a tool's effect and returns its reference.
func (t *travel) do(ctx context.Context, tool, what, prefix string) string {
	a, _ := receiptmcp.AttemptFrom(ctx)
	t.mu.Lock()
	t.effects = append(t.effects, effect{tool, a.Key.ID, what})
	ref := fmt.Sprintf("%s-%d", prefix, len(t.effects))
	hold := t.holdAfter == tool
	if hold {
		t.holdAfter = ""
	}
	t.mu.Unlock()
	if hold {
		t.effected <- tool
		<-t.release
	}
	return ref
}

func (t *travel) snapshot() []effect {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]effect(nil), t.effects...)
}

func (t *travel) close() error {
	err := t.srv.Close()
	if cerr := t.db.Close(); err == nil {
		err = cerr
	}
	return err
}
