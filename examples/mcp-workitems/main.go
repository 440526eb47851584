// Command mcp-workitems shows receiptmcp end to end: an MCP server with a
// "create_work_item" tool, served over streamable HTTP behind bearer-token
// auth, and a host whose first call times out while the tool is still
// working. The host retries with the same operation key; the work item is
// created once and the retry gets the stored result.
//
//	go run ./examples/mcp-workitems
//
// Flags: -dir keeps the store in a directory (default: a temporary one);
// -pg DSN keeps it, and the tracker's work items, on PostgreSQL (schema
// -schema), and -pg alone on a throwaway cluster started from the installed
// server binaries and removed at exit; -slow is how long creating a work
// item takes; -timeout is the host's patience on its first attempt; -serve
// ADDR only runs the server (tokens "alice-token" and "bob-token"), for
// trying other MCP clients against it.
//
//	go run ./examples/mcp-workitems -pg
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
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/examples/internal/exampledb"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptmcp"
)

type options struct {
	dir     string
	pg      exampledb.PGFlag
	schema  string
	serve   string
	slow    time.Duration
	timeout time.Duration
}

func main() {
	var o options
	fs := flag.NewFlagSet("mcp-workitems", flag.ExitOnError)
	fs.StringVar(&o.dir, "dir", "", "store directory (default: a temporary directory, removed at exit)")
	fs.Var(&o.pg, "pg", "keep the store on PostgreSQL: -pg DSN, or -pg alone for a throwaway cluster")
	fs.StringVar(&o.schema, "schema", "mcp_workitems", "PostgreSQL schema of the store and the tracker (with -pg)")
	fs.StringVar(&o.serve, "serve", "", "only serve MCP on this address (e.g. 127.0.0.1:8080)")
	fs.DurationVar(&o.slow, "slow", 400*time.Millisecond, "how long creating a work item takes")
	fs.DurationVar(&o.timeout, "timeout", 150*time.Millisecond, "the host's timeout on its first attempt")
	_ = fs.Parse(exampledb.Args(os.Args[1:]))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, o); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer, o options) (err error) {
	dir := o.dir
	if dir == "" && o.pg == "" {
		tmp, err := os.MkdirTemp("", "mcp-workitems")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	store, err := exampledb.Open(ctx, exampledb.Config{Dir: dir, PG: string(o.pg), Schema: o.schema,
		Log: slog.New(slog.NewTextHandler(w, nil))})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, store.Close()) }()
	db := store.DB
	var tracker tracker
	if store.Pool != nil {
		tracker, err = openPGTracker(ctx, store.Pool, store.Schema)
	} else {
		tracker, err = openPebbleTracker(pebblestore.DB(db))
	}
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

func newServer(db *receipts.DB, tracker tracker, slow time.Duration) *mcp.Server {
	server := mcp.NewServer(&mcp.Implementation{Name: "workitems", Version: "v1"}, nil)
	mcp.AddTool(server, createTool, func(ctx context.Context, req *mcp.CallToolRequest, args createArgs) (*mcp.CallToolResult, WorkItem, error) {
		a, ok := receiptmcp.AttemptFrom(ctx)
		if !ok { // cannot happen: the key is required
			return nil, WorkItem{}, errors.New("no operation key")
		}
		// a.Recovered would mean an earlier attempt's outcome is unknown.
		// Here the work item is written with the receipt (Stage), so an
		// attempt that left no receipt left no work item either: creating
		// it is safe. An effect outside this store would be looked up first,
		// by a.ProviderKey.
		select { // the tracker's backend is slow
		case <-time.After(slow):
		case <-ctx.Done():
			return nil, WorkItem{}, ctx.Err()
		}
		id, err := tracker.nextID(ctx)
		if err != nil {
			return nil, WorkItem{}, err
		}
		item := WorkItem{ID: id, Title: args.Title, Assignee: args.Assignee, CreatedBy: a.Key.Scope}
		put, err := tracker.put(item)
		if err != nil {
			return nil, WorkItem{}, err
		}
		a.Stage(put) // the item commits with the receipt of this result
		return nil, item, nil
	})
	mcp.AddTool(server, listTool, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, workItemList, error) {
		items, err := tracker.list(ctx)
		return nil, workItemList{Items: items}, err
	})
	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{
		Policies: receiptmcp.PoliciesFor(createTool, listTool),
	}))
	return server
}

// tracker keeps the work items in the receipts store's own database, so
// that each commits with its receipt (Attempt.Stage): in one Pebble batch,
// or one PostgreSQL transaction.
type tracker interface {
	// nextID numbers a new work item.
	nextID(ctx context.Context) (uint64, error)
	// put is the effect that writes item.
	put(item WorkItem) (receipts.Effect, error)
	// list reads every work item, by id.
	list(ctx context.Context) ([]WorkItem, error)
}

// pebbleTracker keeps work items in the store's Pebble database, under a
// prefix of its own.
type pebbleTracker struct {
	pdb  *pebble.DB
	mu   sync.Mutex
	last uint64
}

var itemPrefix = []byte("workitems/")

func itemKey(id uint64) []byte { return binary.BigEndian.AppendUint64(bytes.Clone(itemPrefix), id) }

func openPebbleTracker(pdb *pebble.DB) (*pebbleTracker, error) {
	t := &pebbleTracker{pdb: pdb}
	items, err := t.list(context.Background())
	if err != nil {
		return nil, err
	}
	if len(items) > 0 {
		t.last = items[len(items)-1].ID
	}
	return t, nil
}

func (t *pebbleTracker) nextID(context.Context) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	return t.last, nil
}

func (t *pebbleTracker) put(item WorkItem) (receipts.Effect, error) {
	v, err := json.Marshal(item)
	if err != nil {
		return nil, err
	}
	return receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error {
		return b.Set(itemKey(item.ID), v, nil)
	}), nil
}

func (t *pebbleTracker) list(context.Context) ([]WorkItem, error) {
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

// pgTracker keeps work items in a table of the store's PostgreSQL schema,
// numbered by a sequence (so that every server sharing the database
// numbers them apart).
type pgTracker struct {
	pool       *pgxpool.Pool
	table, seq string // schema-qualified, quoted
}

func openPGTracker(ctx context.Context, pool *pgxpool.Pool, schema string) (*pgTracker, error) {
	t := &pgTracker{pool: pool, table: pgx.Identifier{schema, "work_items"}.Sanitize(),
		seq: pgx.Identifier{schema, "work_item_ids"}.Sanitize()}
	// Under an advisory lock (exampledb.CreateObjects): replicas may start at once.
	if err := exampledb.CreateObjects(ctx, pool, schema,
		`CREATE SEQUENCE IF NOT EXISTS `+t.seq,
		`CREATE TABLE IF NOT EXISTS `+t.table+` (id bigint PRIMARY KEY, item jsonb NOT NULL)`,
	); err != nil {
		return nil, fmt.Errorf("tracker: %w", err)
	}
	return t, nil
}

func (t *pgTracker) nextID(ctx context.Context) (uint64, error) {
	var id uint64
	err := t.pool.QueryRow(ctx, `SELECT nextval($1::regclass)`, t.seq).Scan(&id)
	return id, err
}

func (t *pgTracker) put(item WorkItem) (receipts.Effect, error) {
	v, err := json.Marshal(item)
	if err != nil {
		return nil, err
	}
	return receipts.EffectOn(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+t.table+` (id, item) VALUES ($1, $2)`, item.ID, v)
		return err
	}), nil
}

func (t *pgTracker) list(ctx context.Context) ([]WorkItem, error) {
	rows, err := t.pool.Query(ctx, `SELECT item FROM `+t.table+` ORDER BY id`)
	if err != nil {
		return nil, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkItem, error) {
		var item WorkItem
		err := r.Scan(&item)
		return item, err
	})
	if items == nil {
		items = []WorkItem{}
	}
	return items, err
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
