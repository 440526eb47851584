// Command mcp-workitems shows receiptmcp end to end: an MCP server with a
// "create_work_item" tool, served over streamable HTTP behind bearer-token
// auth, and a host whose first call times out while the tool is still
// working. The host retries with the same operation key; the work item is
// created once and the retry gets the stored result.
//
//	go run ./examples/mcp-workitems
//
// Flags: -dir keeps the store in a directory (default: a temporary one);
// -slow is how long creating a work item takes; -timeout is the host's
// patience on its first attempt; -serve ADDR only runs the server (tokens
// "alice-token" and "bob-token"), for trying other MCP clients against it.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
)

type options struct {
	dir     string
	serve   string
	slow    time.Duration
	timeout time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", "", "store directory (default: a temporary directory, removed at exit)")
	flag.StringVar(&o.serve, "serve", "", "only serve MCP on this address (e.g. 127.0.0.1:8080)")
	flag.DurationVar(&o.slow, "slow", 400*time.Millisecond, "how long creating a work item takes")
	flag.DurationVar(&o.timeout, "timeout", 150*time.Millisecond, "the host's timeout on its first attempt")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, o); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer, o options) error {
	dir := o.dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "mcp-workitems")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	db, err := receipts.Open(dir, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	tracker, err := openTracker(db.Pebble())
	if err != nil {
		return err
	}

	server := newServer(db, tracker, o.slow)
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	handler := auth.RequireBearerToken(verifyToken, nil)(mcpHandler)

	if o.serve != "" {
		srv := &http.Server{Addr: o.serve, Handler: handler}
		go func() {
			<-ctx.Done()
			_ = srv.Shutdown(context.Background())
		}()
		fmt.Fprintf(w, "serving MCP on http://%s (Authorization: Bearer alice-token)\n", o.serve)
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Shutdown(context.Background())
	return runHost(ctx, w, "http://"+ln.Addr().String(), "alice-token", o.timeout)
}

// ---- server ----

// tokens stands in for a real token verifier (JWT, introspection): the
// token's user is the scope of the operation keys it sends.
var tokens = map[string]string{"alice-token": "alice", "bob-token": "bob"}

func verifyToken(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	user, ok := tokens[token]
	if !ok {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
}

type createArgs struct {
	Title    string `json:"title" jsonschema:"what needs doing"`
	Assignee string `json:"assignee,omitempty" jsonschema:"who should do it"`
}

// WorkItem is what the tracker stores.
type WorkItem struct {
	ID        uint64 `json:"id"`
	Title     string `json:"title"`
	Assignee  string `json:"assignee,omitempty"`
	CreatedBy string `json:"createdBy"`
}

type workItemList struct {
	Items []WorkItem `json:"items"`
}

var (
	createTool = &mcp.Tool{
		Name:        "create_work_item",
		Description: "Create a work item in the tracker.",
		// Not read-only, not idempotent: receiptmcp.PolicyFor makes the
		// operation key required.
		Annotations: &mcp.ToolAnnotations{Title: "Create work item"},
	}
	listTool = &mcp.Tool{
		Name:        "list_work_items",
		Description: "List the tracker's work items.",
		Annotations: &mcp.ToolAnnotations{Title: "List work items", ReadOnlyHint: true},
	}
)

func newServer(db *receipts.DB, tracker *tracker, slow time.Duration) *mcp.Server {
	server := mcp.NewServer(&mcp.Implementation{Name: "workitems", Version: "v1"}, nil)
	mcp.AddTool(server, createTool, func(ctx context.Context, req *mcp.CallToolRequest, args createArgs) (*mcp.CallToolResult, WorkItem, error) {
		a, ok := receiptmcp.AttemptFrom(ctx)
		if !ok { // cannot happen: the key is required
			return nil, WorkItem{}, errors.New("no operation key")
		}
		// a.Recovered would mean an earlier attempt's outcome is unknown.
		// Here the work item is written with the receipt (AddEffect), so an
		// attempt that left no receipt left no work item either: creating
		// it is safe. An effect outside this store would be looked up first,
		// by a.ProviderKey.
		select { // the tracker's backend is slow
		case <-time.After(slow):
		case <-ctx.Done():
			return nil, WorkItem{}, ctx.Err()
		}
		item := WorkItem{ID: tracker.nextID(), Title: args.Title, Assignee: args.Assignee, CreatedBy: a.Key.Scope}
		a.AddEffect(func(b *pebble.Batch) error { return tracker.put(b, item) })
		return nil, item, nil
	})
	mcp.AddTool(server, listTool, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, workItemList, error) {
		items, err := tracker.list()
		return nil, workItemList{Items: items}, err
	})
	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{
		Policies: receiptmcp.PoliciesFor(createTool, listTool),
	}))
	return server
}

// tracker keeps work items in the receipts store's own Pebble database,
// under its own prefix, so that each item commits with its receipt.
type tracker struct {
	pdb  *pebble.DB
	mu   sync.Mutex
	last uint64
}

var itemPrefix = []byte("workitems/")

func itemKey(id uint64) []byte { return binary.BigEndian.AppendUint64(bytes.Clone(itemPrefix), id) }

func openTracker(pdb *pebble.DB) (*tracker, error) {
	t := &tracker{pdb: pdb}
	items, err := t.list()
	if err != nil {
		return nil, err
	}
	if len(items) > 0 {
		t.last = items[len(items)-1].ID
	}
	return t, nil
}

func (t *tracker) nextID() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	return t.last
}

func (t *tracker) put(b *pebble.Batch, item WorkItem) error {
	v, err := json.Marshal(item)
	if err != nil {
		return err
	}
	return b.Set(itemKey(item.ID), v, nil)
}

func (t *tracker) list() ([]WorkItem, error) {
	upper := bytes.Clone(itemPrefix)
	upper[len(upper)-1]++
	it, err := t.pdb.NewIter(&pebble.IterOptions{LowerBound: itemPrefix, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	items := []WorkItem{}
	for it.First(); it.Valid(); it.Next() {
		var item WorkItem
		if err := json.Unmarshal(it.Value(), &item); err != nil {
			return nil, err
		}
		items = append(items, item)
	}
	return items, it.Error()
}

// ---- host ----

// bearer adds the host's token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// runHost plays an agent host: a person approves one action, and the host
// performs it, retrying on timeouts with the key minted at approval.
func runHost(ctx context.Context, w io.Writer, endpoint, token string, timeout time.Duration) error {
	client := mcp.NewClient(&mcp.Implementation{Name: "workitems-host", Version: "v1"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:             endpoint,
		HTTPClient:           &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}},
		DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		return err
	}
	defer cs.Close()

	args := createArgs{Title: "Fix the login page", Assignee: "bob"}
	approved := receiptmcp.WithOperationKey(ctx, receiptmcp.NewOperationKey()) // minted once, at approval
	fmt.Fprintf(w, "approved: create work item %q\n", args.Title)

	wait := timeout
	for attempt := 1; ; attempt++ {
		if attempt > 5 {
			return errors.New("giving up")
		}
		actx, cancel := context.WithTimeout(approved, wait)
		res, err := cs.CallTool(actx, &mcp.CallToolParams{Name: createTool.Name, Arguments: args})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			fmt.Fprintf(w, "attempt %d: no answer within %s; retrying with the same key\n", attempt, wait)
			wait *= 4
			continue
		}
		if _, data, ok := receiptmcp.ParseError(err); ok && data.Type == receiptmcp.TypeInProgress {
			fmt.Fprintf(w, "attempt %d: still running; retrying in %s\n", attempt, data.RetryAfter())
			time.Sleep(min(data.RetryAfter(), time.Second))
			continue
		}
		if err != nil {
			return err
		}
		var item WorkItem
		if err := remarshal(res.StructuredContent, &item); err != nil {
			return err
		}
		fmt.Fprintf(w, "attempt %d: work item #%d %q for %s (replayed: %v)\n",
			attempt, item.ID, item.Title, item.Assignee, res.Meta[receiptmcp.DefaultReplayMetaKey] == true)
		break
	}

	// The same key for a different action is refused.
	_, err = cs.CallTool(approved, &mcp.CallToolParams{Name: createTool.Name,
		Arguments: createArgs{Title: "Something else"}})
	if _, data, ok := receiptmcp.ParseError(err); ok {
		fmt.Fprintf(w, "same key, other arguments: %s\n", data.Type)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: listTool.Name})
	if err != nil {
		return err
	}
	var list workItemList
	if err := remarshal(res.StructuredContent, &list); err != nil {
		return err
	}
	fmt.Fprintf(w, "work items in the tracker: %d\n", len(list.Items))
	return nil
}

func remarshal(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}
