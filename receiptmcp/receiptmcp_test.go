package receiptmcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptmcp"
	"github.com/receiptstore/receipts/receiptstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const leaseTTL = 30 * time.Second

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openDB opens an in-memory store with a fake clock.
func openDB(t testing.TB) (*receipts.DB, *receiptstest.Clock) {
	t.Helper()
	clk := receiptstest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	db, err := pebblestore.Open("/db", &pebblestore.Options{
		Options: receipts.Options{
			Now:        clk.Now,
			LeaseTTL:   leaseTTL,
			GCInterval: -1,
			Logger:     quiet,
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db, clk
}

// seen is what a handler observed of its Attempt.
type seen struct {
	OK          bool
	Number      uint32
	Recovered   bool
	Token       uint64
	ProviderKey string
	Scope       string
}

type itemIn struct {
	Title  string  `json:"title"`
	Points float64 `json:"points,omitempty"`
}

type itemOut struct {
	ID    int64  `json:"id"`
	Title string `json:"title"`
	By    string `json:"by,omitempty"`
}

// fixture is a server with the test tools, the middleware and a store.
type fixture struct {
	t      *testing.T
	db     *receipts.DB
	clk    *receiptstest.Clock
	server *mcp.Server

	runs map[string]*atomic.Int64 // executions per tool

	mu        sync.Mutex
	attempts  []seen
	started   chan struct{} // if set, create_item signals here once it runs
	gate      chan struct{} // if set, create_item waits for it (not for its context)
	ctxErr    error         // create_item's ctx.Err() after the gate
	cancelled chan struct{} // if set, signalled when the server cancels a create_item request
}

var toolDefs = []*mcp.Tool{
	{Name: "create_item", Description: "Creates a work item."},
	{Name: "fail_item", Description: "Always fails (isError)."},
	{Name: "rpc_error", Description: "Refuses with a JSON-RPC error."},
	{Name: "broken", Description: "Fails with an unknown outcome."},
	{Name: "confirm", Description: "Asks for confirmation first."},
	{Name: "list_items", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
	{Name: "touch", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
}

func newFixture(t *testing.T, cfg receiptmcp.Config) *fixture {
	t.Helper()
	db, clk := openDB(t)
	f := &fixture{t: t, db: db, clk: clk, runs: map[string]*atomic.Int64{}}
	for _, td := range toolDefs {
		f.runs[td.Name] = new(atomic.Int64)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	byName := map[string]*mcp.Tool{}
	for _, td := range toolDefs {
		byName[td.Name] = td
	}
	mcp.AddTool(s, byName["create_item"], func(ctx context.Context, req *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, itemOut, error) {
		n := f.runs["create_item"].Add(1)
		f.record(ctx)
		f.mu.Lock()
		started, gate := f.started, f.gate
		f.mu.Unlock()
		if started != nil {
			started <- struct{}{}
		}
		if gate != nil {
			<-gate
			f.mu.Lock()
			f.ctxErr = ctx.Err()
			f.mu.Unlock()
		}
		by := ""
		if req.Extra != nil && req.Extra.TokenInfo != nil {
			by = req.Extra.TokenInfo.UserID
		}
		return nil, itemOut{ID: n, Title: in.Title, By: by}, nil
	})
	mcp.AddTool(s, byName["fail_item"], func(ctx context.Context, req *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, itemOut, error) {
		n := f.runs["fail_item"].Add(1)
		return nil, itemOut{}, errors.New("quota exceeded (run " + itoa(n) + ")")
	})
	mcp.AddTool(s, byName["rpc_error"], func(ctx context.Context, req *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, itemOut, error) {
		f.runs["rpc_error"].Add(1)
		return nil, itemOut{}, &jsonrpc.Error{Code: -32001, Message: "backend unavailable, nothing done"}
	})
	s.AddTool(withSchema(byName["broken"]), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		f.runs["broken"].Add(1)
		f.record(ctx)
		return nil, errors.New("connection reset while writing")
	})
	mcp.AddTool(s, byName["confirm"], func(ctx context.Context, req *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, itemOut, error) {
		n := f.runs["confirm"].Add(1)
		if len(req.Params.InputResponses) == 0 {
			return &mcp.CallToolResult{
				InputRequests: mcp.InputRequestMap{"ok": &mcp.ElicitParams{Message: "Create " + in.Title + "?"}},
				RequestState:  "state-1",
			}, itemOut{}, nil
		}
		return nil, itemOut{ID: n, Title: in.Title}, nil
	})
	mcp.AddTool(s, byName["list_items"], func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		n := f.runs["list_items"].Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: itoa(n)}}}, nil, nil
	})
	mcp.AddTool(s, byName["touch"], func(ctx context.Context, req *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, any, error) {
		n := f.runs["touch"].Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: itoa(n)}}}, nil, nil
	})
	if cfg.Policies == nil {
		cfg.Policies = receiptmcp.PoliciesFor(toolDefs...)
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	s.AddReceivingMiddleware(receiptmcp.Middleware(db, cfg))
	// Outermost: report when the server cancels a create_item request's
	// context (the client cancelled it).
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok && p.Name == "create_item" {
				f.mu.Lock()
				cancelled := f.cancelled
				f.mu.Unlock()
				if cancelled != nil {
					stop := context.AfterFunc(ctx, func() {
						select {
						case cancelled <- struct{}{}:
						default:
						}
					})
					defer stop()
				}
			}
			return next(ctx, method, req)
		}
	})
	f.server = s
	return f
}

func withSchema(t *mcp.Tool) *mcp.Tool {
	c := *t
	c.InputSchema = json.RawMessage(`{"type":"object"}`)
	return &c
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func (f *fixture) record(ctx context.Context) {
	var s seen
	if a, ok := receiptmcp.AttemptFrom(ctx); ok {
		s = seen{OK: true, Number: a.Number, Recovered: a.Recovered, Token: a.Token, ProviderKey: a.ProviderKey, Scope: a.Key.Scope}
	}
	f.mu.Lock()
	f.attempts = append(f.attempts, s)
	f.mu.Unlock()
}

func (f *fixture) lastAttempt() seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.attempts) == 0 {
		f.t.Fatal("no attempt recorded")
	}
	return f.attempts[len(f.attempts)-1]
}

func (f *fixture) runCount(tool string) int64 { return f.runs[tool].Load() }

// connect connects a client over the in-memory transport.
func (f *fixture) connect(opts *mcp.ClientOptions) *mcp.ClientSession {
	f.t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := f.server.Connect(ctx, st, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, opts)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// serveHTTP serves the fixture's server over streamable HTTP behind bearer
// auth: the token is the UserID ("" token is refused).
func (f *fixture) serveHTTP() *httptest.Server {
	f.t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return f.server }, &mcp.StreamableHTTPOptions{Logger: quiet})
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token == "nobody" {
			return &auth.TokenInfo{Expiration: time.Now().Add(time.Hour)}, nil // no UserID
		}
		if !strings.HasPrefix(token, "tok-") {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: strings.TrimPrefix(token, "tok-"), Expiration: time.Now().Add(time.Hour)}, nil
	}
	srv := httptest.NewServer(auth.RequireBearerToken(verify, nil)(h))
	f.t.Cleanup(srv.Close)
	return srv
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// connectHTTP connects a client as token's principal.
func (f *fixture) connectHTTP(srv *httptest.Server, token string) *mcp.ClientSession {
	f.t.Helper()
	hc := &http.Client{Transport: &bearer{token: token, next: srv.Client().Transport}}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: srv.URL, HTTPClient: hc, DisableStandaloneSSE: true, MaxRetries: -1,
	}, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// testTimeout bounds every wait in these tests, so that a bug shows as a
// failure rather than a hung test binary.
const testTimeout = 30 * time.Second

// recv receives from ch, failing the test if nothing arrives in time.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testTimeout):
		t.Fatalf("nothing received in %s", testTimeout)
		panic("unreachable")
	}
}

func call(ctx context.Context, cs *mcp.ClientSession, key, tool string, args any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, testTimeout)
	defer cancel()
	if key != "" {
		ctx = receiptmcp.WithOperationKey(ctx, key)
	}
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
}

func mustCall(t *testing.T, cs *mcp.ClientSession, key, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := call(context.Background(), cs, key, tool, args)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func isReplay(res *mcp.CallToolResult) bool {
	v, _ := res.Meta[receiptmcp.DefaultReplayMetaKey].(bool)
	return v
}

// comparable strips what legitimately differs between an answer and its
// replay: the replay's _meta entries.
func comparable(res *mcp.CallToolResult) map[string]any {
	b, err := json.Marshal(res)
	if err != nil {
		panic(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	if meta, ok := m["_meta"].(map[string]any); ok {
		delete(meta, receiptmcp.DefaultReplayMetaKey)
		delete(meta, receiptmcp.RecordedAtMetaKey)
		delete(meta, receiptmcp.ExpiresAtMetaKey)
		if len(meta) == 0 {
			delete(m, "_meta")
		}
	}
	return m
}

func wantError(t *testing.T, err error, code int64, typ string) *receiptmcp.ErrorData {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want code %d type %q", code, typ)
	}
	gotCode, data, ok := receiptmcp.ParseError(err)
	if !ok {
		t.Fatalf("got error %v, want code %d type %q", err, code, typ)
	}
	if gotCode != code || data.Type != typ {
		t.Fatalf("got code %d type %q (%v), want code %d type %q", gotCode, data.Type, err, code, typ)
	}
	return data
}

// session connects a client over the named transport ("memory" or
// "http") and returns it with the scope its calls get.
func (f *fixture) session(transport string, srv *httptest.Server) (*mcp.ClientSession, string) {
	f.t.Helper()
	if transport == "memory" {
		return f.connect(nil), "local"
	}
	return f.connectHTTP(srv, "tok-alice"), "alice"
}

var transports = []string{"memory", "http"}

func TestRetryRunsOnceAndReplays(t *testing.T) {
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
			srv := f.serveHTTP()
			cs, scope := f.session(transport, srv)
			key := receiptmcp.NewOperationKey()
			args := map[string]any{"title": "Fix the login page", "points": 3}

			first := mustCall(t, cs, key, "create_item", args)
			if first.IsError || isReplay(first) {
				t.Fatalf("first answer: isError=%v replay=%v", first.IsError, isReplay(first))
			}
			// Retries on the same session, and from a new session (the host
			// lost its connection and reconnected).
			cs2, _ := f.session(transport, srv)
			for i, c := range []*mcp.ClientSession{cs, cs, cs2} {
				again := mustCall(t, c, key, "create_item", args)
				if !isReplay(again) {
					t.Fatalf("retry %d not marked as a replay: %v", i, again.Meta)
				}
				if diff := cmp.Diff(comparable(first), comparable(again)); diff != "" {
					t.Fatalf("replay differs (-first +replay):\n%s", diff)
				}
			}
			if n := f.runCount("create_item"); n != 1 {
				t.Fatalf("tool ran %d times, want 1", n)
			}
			a := f.lastAttempt()
			if !a.OK || a.Number != 1 || a.Recovered || a.Scope != scope || a.ProviderKey == "" {
				t.Fatalf("attempt seen by the handler: %+v", a)
			}
			rec, err := f.db.Lookup(context.Background(), receipts.Key{Scope: scope, ID: key})
			if err != nil || rec.State != receipts.Succeeded {
				t.Fatalf("Lookup: %v %v", rec, err)
			}

			// Another key is another action.
			other := mustCall(t, cs, receiptmcp.NewOperationKey(), "create_item", args)
			if isReplay(other) || f.runCount("create_item") != 2 {
				t.Fatalf("a new key did not run the tool (runs %d)", f.runCount("create_item"))
			}
		})
	}
}

func TestFingerprintIgnoresSpelling(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs := f.connect(nil)
	key := receiptmcp.NewOperationKey()
	mustCall(t, cs, key, "create_item", json.RawMessage(`{"title":"a","points":1}`))
	res := mustCall(t, cs, key, "create_item", json.RawMessage(`{ "points": 1.0, "title": "a" }`))
	if !isReplay(res) || f.runCount("create_item") != 1 {
		t.Fatalf("same intent spelled differently ran again (runs %d)", f.runCount("create_item"))
	}
}

func TestConflict(t *testing.T) {
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
			cs, _ := f.session(transport, f.serveHTTP())
			key := receiptmcp.NewOperationKey()
			mustCall(t, cs, key, "create_item", map[string]any{"title": "a"})

			_, err := call(context.Background(), cs, key, "create_item", map[string]any{"title": "b"})
			data := wantError(t, err, receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyConflict)
			if data.Tool != "create_item" || data.MetaKey != receiptmcp.DefaultMetaKey {
				t.Errorf("data = %+v", data)
			}
			// Same arguments, another tool: also another intent.
			_, err = call(context.Background(), cs, key, "fail_item", map[string]any{"title": "a"})
			wantError(t, err, receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyConflict)
			if n := f.runCount("create_item") + f.runCount("fail_item"); n != 1 {
				t.Fatalf("tools ran %d times, want 1", n)
			}
		})
	}
}

func TestInProgressWaitsThenReplays(t *testing.T) {
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: time.Minute})
			cs, _ := f.session(transport, f.serveHTTP())
			f.started, f.gate = make(chan struct{}, 1), make(chan struct{})
			key := receiptmcp.NewOperationKey()
			args := map[string]any{"title": "slow"}

			type answer struct {
				res *mcp.CallToolResult
				err error
			}
			firstC := make(chan answer, 1)
			go func() {
				res, err := call(context.Background(), cs, key, "create_item", args)
				firstC <- answer{res, err}
			}()
			recv(t, f.started)

			secondC := make(chan answer, 1)
			go func() {
				res, err := call(context.Background(), cs, key, "create_item", args)
				secondC <- answer{res, err}
			}()
			// The duplicate is waiting (it cannot finish before the gate opens).
			select {
			case a := <-secondC:
				t.Fatalf("duplicate answered while the first call runs: %v %v", a.res, a.err)
			case <-time.After(50 * time.Millisecond):
			}
			close(f.gate)
			first, second := recv(t, firstC), recv(t, secondC)
			if first.err != nil || second.err != nil {
				t.Fatalf("errors: %v, %v", first.err, second.err)
			}
			if !isReplay(second.res) || isReplay(first.res) {
				t.Fatalf("replay flags: first %v second %v", isReplay(first.res), isReplay(second.res))
			}
			if diff := cmp.Diff(comparable(first.res), comparable(second.res)); diff != "" {
				t.Fatalf("replay differs:\n%s", diff)
			}
			if n := f.runCount("create_item"); n != 1 {
				t.Fatalf("tool ran %d times, want 1", n)
			}
		})
	}
}

func TestInProgressTimeout(t *testing.T) {
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: 20 * time.Millisecond})
			cs, _ := f.session(transport, f.serveHTTP())
			f.started, f.gate = make(chan struct{}, 1), make(chan struct{})
			key := receiptmcp.NewOperationKey()
			args := map[string]any{"title": "slow"}

			done := make(chan error, 1)
			go func() {
				_, err := call(context.Background(), cs, key, "create_item", args)
				done <- err
			}()
			recv(t, f.started)
			_, err := call(context.Background(), cs, key, "create_item", args)
			data := wantError(t, err, receiptmcp.CodeInProgress, receiptmcp.TypeInProgress)
			// The holder's lease has all of its TTL left by the fake clock.
			if data.RetryAfter() <= 0 || data.RetryAfter() > leaseTTL {
				t.Errorf("retry after %s, want in (0, %s]", data.RetryAfter(), leaseTTL)
			}
			var je *jsonrpc.Error
			if errors.As(err, &je) && (je.Code >= -32768 && je.Code <= -32000) {
				t.Errorf("in-progress code %d is in JSON-RPC's reserved range", je.Code)
			}

			close(f.gate)
			if err := recv(t, done); err != nil {
				t.Fatal(err)
			}
			if res := mustCall(t, cs, key, "create_item", args); !isReplay(res) {
				t.Fatal("retry after the first finished was not a replay")
			}
			if n := f.runCount("create_item"); n != 1 {
				t.Fatalf("tool ran %d times, want 1", n)
			}
		})
	}
}

func TestPrincipalsAreSeparate(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{})
	srv := f.serveHTTP()
	alice := f.connectHTTP(srv, "tok-alice")
	bob := f.connectHTTP(srv, "tok-bob")
	key := "shared-key-0001" // both hosts happen to use the same key
	args := map[string]any{"title": "same"}

	ra := mustCall(t, alice, key, "create_item", args)
	rb := mustCall(t, bob, key, "create_item", args)
	if isReplay(rb) {
		t.Fatal("bob got alice's receipt")
	}
	if n := f.runCount("create_item"); n != 2 {
		t.Fatalf("tool ran %d times, want 2 (once per principal)", n)
	}
	var oa, ob itemOut
	remarshal(t, ra.StructuredContent, &oa)
	remarshal(t, rb.StructuredContent, &ob)
	if oa.By != "alice" || ob.By != "bob" {
		t.Fatalf("results: %+v %+v", oa, ob)
	}
	// Each replays their own; bob may even use other arguments under the key.
	ra2 := mustCall(t, alice, key, "create_item", args)
	var oa2 itemOut
	remarshal(t, ra2.StructuredContent, &oa2)
	if !isReplay(ra2) || oa2 != oa {
		t.Fatalf("alice's replay: %+v replay=%v", oa2, isReplay(ra2))
	}
	_, err := call(context.Background(), bob, key, "create_item", map[string]any{"title": "other"})
	wantError(t, err, receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyConflict)
	if _, err := call(context.Background(), alice, receiptmcp.NewOperationKey(), "create_item", map[string]any{"title": "other"}); err != nil {
		t.Fatal(err)
	}

	// A token without a UserID cannot scope a key.
	nobody := f.connectHTTP(srv, "nobody")
	_, err = call(context.Background(), nobody, key, "create_item", args)
	wantError(t, err, receiptmcp.CodeUnauthenticated, receiptmcp.TypeScopeMissing)
	// ... but tools that skip the engine still work.
	if _, err := call(context.Background(), nobody, key, "list_items", nil); err != nil {
		t.Fatal(err)
	}
}

func remarshal(t *testing.T, from, to any) {
	t.Helper()
	b, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, to); err != nil {
		t.Fatal(err)
	}
}

func TestStdioFixedScope(t *testing.T) {
	// The in-memory transport, like stdio, carries no token.
	f := newFixture(t, receiptmcp.Config{FixedScope: "desktop-user"})
	cs := f.connect(nil)
	key := receiptmcp.NewOperationKey()
	mustCall(t, cs, key, "create_item", map[string]any{"title": "a"})
	if a := f.lastAttempt(); a.Scope != "desktop-user" {
		t.Fatalf("scope %q", a.Scope)
	}
	if _, err := f.db.Lookup(context.Background(), receipts.Key{Scope: "desktop-user", ID: key}); err != nil {
		t.Fatal(err)
	}

	// No token and no FixedScope: no service.
	g := newFixture(t, receiptmcp.Config{})
	cs2 := g.connect(nil)
	_, err := call(context.Background(), cs2, key, "create_item", map[string]any{"title": "a"})
	wantError(t, err, receiptmcp.CodeUnauthenticated, receiptmcp.TypeScopeMissing)
	if g.runCount("create_item") != 0 {
		t.Fatal("tool ran without a scope")
	}
}

func TestPolicies(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs := f.connect(nil)

	// Required: missing key is invalid params with typed data.
	_, err := call(context.Background(), cs, "", "create_item", map[string]any{"title": "a"})
	data := wantError(t, err, receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyMissing)
	if data.MetaKey != receiptmcp.DefaultMetaKey || data.Tool != "create_item" {
		t.Errorf("data = %+v", data)
	}
	if f.runCount("create_item") != 0 {
		t.Fatal("tool ran without its required key")
	}

	// Optional (idempotentHint): without a key it runs each time, with one once.
	mustCall(t, cs, "", "touch", map[string]any{"title": "a"})
	mustCall(t, cs, "", "touch", map[string]any{"title": "a"})
	key := receiptmcp.NewOperationKey()
	mustCall(t, cs, key, "touch", map[string]any{"title": "a"})
	if res := mustCall(t, cs, key, "touch", map[string]any{"title": "a"}); !isReplay(res) {
		t.Fatal("optional tool with a key was not replayed")
	}
	if n := f.runCount("touch"); n != 3 {
		t.Fatalf("touch ran %d times, want 3", n)
	}

	// Skip (readOnlyHint): the key is ignored.
	mustCall(t, cs, key, "list_items", nil)
	if res := mustCall(t, cs, key, "list_items", nil); isReplay(res) || f.runCount("list_items") != 2 {
		t.Fatalf("read-only tool went through the engine (runs %d)", f.runCount("list_items"))
	}

	// A malformed key.
	_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: "create_item", Arguments: map[string]any{"title": "a"},
		Meta: mcp.Meta{receiptmcp.DefaultMetaKey: 42},
	})
	wantError(t, err, receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyInvalid)
	_, err = call(context.Background(), cs, strings.Repeat("k", receipts.MaxKeyPartLen+1), "create_item", map[string]any{"title": "a"})
	wantError(t, err, receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyInvalid)
}

func TestIsErrorResultIsStoredAndReplayed(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs := f.connect(nil)
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"title": "a"}
	first := mustCall(t, cs, key, "fail_item", args)
	if !first.IsError {
		t.Fatal("want an isError result")
	}
	again := mustCall(t, cs, key, "fail_item", args)
	if !again.IsError || !isReplay(again) {
		t.Fatalf("retry: isError=%v replay=%v", again.IsError, isReplay(again))
	}
	if diff := cmp.Diff(comparable(first), comparable(again)); diff != "" {
		t.Fatalf("replay differs:\n%s", diff)
	}
	if n := f.runCount("fail_item"); n != 1 {
		t.Fatalf("tool ran %d times, want 1", n)
	}
	rec, err := f.db.Lookup(context.Background(), receipts.Key{Scope: "local", ID: key})
	if err != nil || rec.State != receipts.Failed {
		t.Fatalf("Lookup: %+v %v", rec, err)
	}
}

func TestNeedsInputIsNotStored(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs := f.connect(&mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"title": "a"}

	res := mustCall(t, cs, key, "confirm", args)
	if !res.NeedsInput() {
		t.Fatal("want an input-required result")
	}
	if _, err := f.db.Lookup(context.Background(), receipts.Key{Scope: "local", ID: key}); !errors.Is(err, receipts.ErrNotFound) {
		t.Fatalf("input-required result was recorded: %v", err)
	}
	// The follow-up with the answers runs the tool under the same key.
	ctx := receiptmcp.WithOperationKey(context.Background(), key)
	params := &mcp.CallToolParams{Name: "confirm", Arguments: args,
		InputResponses: mcp.InputResponseMap{"ok": &mcp.ElicitResult{Action: "accept"}},
		RequestState:   res.RequestState}
	done, err := cs.CallTool(ctx, params)
	if err != nil || done.NeedsInput() || isReplay(done) {
		t.Fatalf("follow-up: %+v %v", done, err)
	}
	again, err := cs.CallTool(ctx, params)
	if err != nil || !isReplay(again) {
		t.Fatalf("retry of the follow-up: %+v %v", again, err)
	}
	if n := f.runCount("confirm"); n != 2 {
		t.Fatalf("tool ran %d times, want 2", n)
	}

	// With the SDK's automatic multi round-trip, the host sees one call.
	f2 := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs2 := f2.connect(&mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	})
	key2 := receiptmcp.NewOperationKey()
	if res := mustCall(t, cs2, key2, "confirm", args); res.NeedsInput() || res.IsError {
		t.Fatalf("auto round trip: %+v", res)
	}
	if res := mustCall(t, cs2, key2, "confirm", args); !isReplay(res) {
		t.Fatal("retry after the round trip was not a replay")
	}
	if n := f2.runCount("confirm"); n != 2 {
		t.Fatalf("tool ran %d times, want 2 (ask, then do)", n)
	}
}

func TestJSONRPCErrorReleasesClaim(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs := f.connect(nil)
	key := receiptmcp.NewOperationKey()
	for i := 0; i < 2; i++ {
		_, err := call(context.Background(), cs, key, "rpc_error", map[string]any{"title": "a"})
		var je *jsonrpc.Error
		if !errors.As(err, &je) || je.Code != -32001 {
			t.Fatalf("got %v, want the handler's JSON-RPC error", err)
		}
		if _, err := f.db.Lookup(context.Background(), receipts.Key{Scope: "local", ID: key}); !errors.Is(err, receipts.ErrNotFound) {
			t.Fatalf("claim not released: %v", err)
		}
	}
	if n := f.runCount("rpc_error"); n != 2 {
		t.Fatalf("tool ran %d times, want 2", n)
	}
}

func TestCrashLeavesOutcomeUncertain(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: -1})
	cs := f.connect(nil)
	ctx := context.Background()
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"title": "a"}

	// A server process claimed the key, started the tool and died: its
	// claim is in the store, its lease runs out.
	fp, err := receiptmcp.Fingerprint("create_item", json.RawMessage(`{"title":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	lease, _, err := f.db.Claim(ctx, receipts.Key{Scope: "local", ID: key}, fp)
	if err != nil {
		t.Fatal(err)
	}
	_, err = call(ctx, cs, key, "create_item", args)
	wantError(t, err, receiptmcp.CodeInProgress, receiptmcp.TypeInProgress)

	f.clk.Advance(leaseTTL)
	res := mustCall(t, cs, key, "create_item", args)
	if res.IsError || isReplay(res) {
		t.Fatalf("takeover: %+v", res)
	}
	a := f.lastAttempt()
	if !a.Recovered || a.Number != 2 || a.ProviderKey != lease.ProviderKey() {
		t.Fatalf("attempt after a crash: %+v (provider key of the first %q)", a, lease.ProviderKey())
	}
	if a.Token <= lease.Token() {
		t.Fatalf("takeover's token %d, want more than the dead holder's %d", a.Token, lease.Token())
	}
	if r, err := f.db.Lookup(ctx, receipts.Key{Scope: "local", ID: key}); err != nil || r.Token != a.Token {
		t.Fatalf("receipt %+v, %v: want the takeover's token %d", r, err, a.Token)
	}
	if _, err := lease.Commit(ctx, []byte("late")); !errors.Is(err, receipts.ErrLeaseLost) {
		t.Fatalf("the dead holder's commit: %v, want ErrLeaseLost", err)
	}
}

// Config.LeaseFor gives each call's claim its own lease: a duplicate that
// comes after the store's 30s LeaseTTL finds the first call in progress.
func TestLeaseForHoldsTheClaim(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: -1, LeaseFor: 10 * time.Minute})
	started, gate := make(chan struct{}, 1), make(chan struct{})
	f.mu.Lock()
	f.started, f.gate = started, gate
	f.mu.Unlock()
	cs := f.connect(nil)
	ctx := context.Background()
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"title": "a"}
	done := make(chan error, 1)
	go func() {
		_, err := call(ctx, cs, key, "create_item", args)
		done <- err
	}()
	recv(t, started)
	r, err := f.db.Lookup(ctx, receipts.Key{Scope: "local", ID: key})
	if err != nil {
		t.Fatal(err)
	}
	if want := f.clk.Now().Add(10 * time.Minute); !r.LeaseExpiresAt.Equal(want) {
		t.Fatalf("LeaseExpiresAt %s, want %s", r.LeaseExpiresAt, want)
	}
	f.clk.Advance(time.Minute)
	_, err = call(ctx, cs, key, "create_item", args)
	data := wantError(t, err, receiptmcp.CodeInProgress, receiptmcp.TypeInProgress)
	if data.RetryAfterMs != (9 * time.Minute).Milliseconds() {
		t.Fatalf("retryAfterMs %d, want 9 minutes", data.RetryAfterMs)
	}
	close(gate)
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	if n := f.runCount("create_item"); n != 1 {
		t.Fatalf("tool ran %d times", n)
	}
}

func TestUnknownErrorLeavesOutcomeUncertain(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: -1})
	cs := f.connect(nil)
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"title": "a"}

	_, err := call(context.Background(), cs, key, "broken", args)
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("got %v", err)
	}
	if a := f.lastAttempt(); a.Recovered || a.Number != 1 {
		t.Fatalf("first attempt %+v", a)
	}
	// Whether the claim was abandoned at once or its lease must run out,
	// once it has, the next attempt is told the outcome is unknown.
	f.clk.Advance(leaseTTL)
	_, _ = call(context.Background(), cs, key, "broken", args)
	if a := f.lastAttempt(); !a.Recovered || a.Number != 2 {
		t.Fatalf("second attempt %+v, want Recovered, Number 2", a)
	}
}

func TestClientCancelMidCallAndRetry(t *testing.T) {
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: 10 * time.Second})
			cs, _ := f.session(transport, f.serveHTTP())
			f.started, f.gate = make(chan struct{}, 1), make(chan struct{})
			f.cancelled = make(chan struct{}, 1)
			key := receiptmcp.NewOperationKey()
			args := map[string]any{"title": "a"}

			ctx, cancel := context.WithCancel(context.Background())
			errC := make(chan error, 1)
			go func() {
				_, err := call(ctx, cs, key, "create_item", args)
				errC <- err
			}()
			recv(t, f.started)
			cancel() // the host gives up mid-call
			if err := recv(t, errC); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled call: %v", err)
			}
			recv(t, f.cancelled) // the server got the cancellation ...
			close(f.gate)        // ... and the tool finishes anyway

			res := mustCall(t, cs, key, "create_item", args) // the host retries
			if !isReplay(res) {
				t.Fatal("retry after cancel was not a replay")
			}
			if n := f.runCount("create_item"); n != 1 {
				t.Fatalf("tool ran %d times, want 1", n)
			}
			f.mu.Lock()
			ctxErr := f.ctxErr
			f.mu.Unlock()
			if ctxErr != nil {
				t.Fatalf("the handler's context was cut: %v", ctxErr)
			}
		})
	}
}

func TestStagedPebbleEffectCommitsWithReceipt(t *testing.T) {
	db, _ := openDB(t)
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	var runs atomic.Int64
	mcp.AddTool(s, &mcp.Tool{Name: "put"}, func(ctx context.Context, req *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, any, error) {
		runs.Add(1)
		a, ok := receiptmcp.AttemptFrom(ctx)
		if !ok {
			return nil, nil, errors.New("no attempt")
		}
		a.Stage(pebblestore.Effect(func(b *pebble.Batch) error {
			if in.Title == "bad" {
				return errors.New("cannot write")
			}
			return b.Set([]byte("app/"+in.Title), []byte("x"), nil)
		}))
		if in.Points < 0 {
			return nil, nil, errors.New("negative points")
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	s.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "local", Logger: quiet}))
	f := &fixture{t: t, db: db, server: s}
	cs := f.connect(nil)

	mustCall(t, cs, "k1", "put", map[string]any{"title": "a"})
	if v, closer, err := pebblestore.DB(db).Get([]byte("app/a")); err != nil || string(v) != "x" {
		t.Fatalf("effect not applied: %q %v", v, err)
	} else {
		closer.Close()
	}
	mustCall(t, cs, "k1", "put", map[string]any{"title": "a"})
	// isError: effects are dropped.
	if res := mustCall(t, cs, "k2", "put", map[string]any{"title": "b", "points": -1}); !res.IsError {
		t.Fatal("want isError")
	}
	if _, _, err := pebblestore.DB(db).Get([]byte("app/b")); !errors.Is(err, pebble.ErrNotFound) {
		t.Fatalf("effect of an isError result applied: %v", err)
	}
	// An effect that fails: nothing is recorded, the client is told so.
	_, err := call(context.Background(), cs, "k3", "put", map[string]any{"title": "bad"})
	wantError(t, err, receiptmcp.CodeNotRecorded, receiptmcp.TypeNotRecorded)
	if n := runs.Load(); n != 3 {
		t.Fatalf("tool ran %d times, want 3", n)
	}
}

func TestClientMiddlewareLeavesParamsAlone(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local"})
	cs := f.connect(nil)
	params := &mcp.CallToolParams{Name: "create_item", Arguments: map[string]any{"title": "a"}, Meta: mcp.Meta{"com.example/trace": "t1"}}
	ctx := receiptmcp.WithOperationKey(context.Background(), "k-ctx")
	if _, err := cs.CallTool(ctx, params); err != nil {
		t.Fatal(err)
	}
	if _, ok := params.Meta[receiptmcp.DefaultMetaKey]; ok {
		t.Fatal("ClientMiddleware changed the caller's params")
	}
	// A key in the params wins over the context's.
	params.Meta[receiptmcp.DefaultMetaKey] = "k-params"
	if _, err := cs.CallTool(ctx, params); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"k-ctx", "k-params"} {
		if _, err := f.db.Lookup(context.Background(), receipts.Key{Scope: "local", ID: id}); err != nil {
			t.Errorf("key %q: %v", id, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	db, _ := openDB(t)
	for _, key := range []string{"io.modelcontextprotocol/key", "dev.mcp/key", "mcp.dev/key", "noprefix", "a..b/key", "com.example/"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("MetaKey %q accepted", key)
				}
			}()
			receiptmcp.Middleware(db, receiptmcp.Config{MetaKey: key})
		}()
	}
	receiptmcp.Middleware(db, receiptmcp.Config{MetaKey: "com.example.tools/opKey"})
	for _, d := range []time.Duration{-time.Second, receipts.DefaultRetention} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("LeaseFor %s accepted", d)
				}
			}()
			receiptmcp.Middleware(db, receiptmcp.Config{LeaseFor: d})
		}()
	}

	for tool, want := range map[*mcp.Tool]receiptmcp.Policy{
		{Name: "a"}: receiptmcp.Required,
		{Name: "b", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}:   receiptmcp.Skip,
		{Name: "c", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}: receiptmcp.Optional,
		{Name: "d", Annotations: &mcp.ToolAnnotations{}}:                     receiptmcp.Required,
	} {
		if got := receiptmcp.PolicyFor(tool); got != want {
			t.Errorf("PolicyFor(%s) = %s, want %s", tool.Name, got, want)
		}
	}
}

// A handler that panics crashes the server (the SDK does not recover), as
// it would without the middleware; the claim is left for the next attempt,
// which is told the outcome is unknown.
func TestPanicLeavesOutcomeUncertain(t *testing.T) {
	db, clk := openDB(t)
	mw := receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "local", Wait: -1, Logger: quiet})
	req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{
		Name:      "create_item",
		Arguments: json.RawMessage(`{"title":"a"}`),
		Meta:      mcp.Meta{receiptmcp.DefaultMetaKey: "k1"},
	}}
	panicking := mw(func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		panic("boom")
	})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_, _ = panicking(context.Background(), "tools/call", req)
	}()

	var got *receiptmcp.Attempt
	ok := mw(func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		got, _ = receiptmcp.AttemptFrom(ctx)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
	})
	clk.Advance(leaseTTL)
	if _, err := ok(context.Background(), "tools/call", req); err != nil {
		t.Fatal(err)
	}
	if got == nil || !got.Recovered || got.Number != 2 {
		t.Fatalf("attempt after a panic: %+v", got)
	}
	// Other methods pass through untouched.
	res, err := ok(context.Background(), "tools/list", &mcp.ListToolsRequest{})
	if err != nil || res == nil {
		t.Fatalf("tools/list: %v %v", res, err)
	}
}

// A handler that outlives its lease (the clock ran past LeaseTTL without a
// renewal) is taken over; its late commit is fenced off, and the receipt is
// the one of the attempt that took over.
func TestStaleHolderIsFenced(t *testing.T) {
	f := newFixture(t, receiptmcp.Config{FixedScope: "local", Wait: -1})
	cs := f.connect(nil)
	f.started, f.gate = make(chan struct{}, 1), make(chan struct{})
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"title": "a"}

	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	firstC := make(chan answer, 1)
	go func() {
		res, err := call(context.Background(), cs, key, "create_item", args)
		firstC <- answer{res, err}
	}()
	recv(t, f.started)
	gate := f.gate
	f.mu.Lock()
	f.started, f.gate = nil, nil // the takeover does not block
	f.mu.Unlock()

	f.clk.Advance(leaseTTL)
	second := mustCall(t, cs, key, "create_item", args)
	if a := f.lastAttempt(); !a.Recovered || a.Number != 2 {
		t.Fatalf("takeover attempt %+v", a)
	}
	close(gate)
	first := recv(t, firstC)
	if first.err != nil {
		t.Fatalf("the stale holder's client: %v", first.err)
	}
	// The stale holder's client still got what its execution did ...
	var o1, o2, o3 itemOut
	remarshal(t, first.res.StructuredContent, &o1)
	remarshal(t, second.StructuredContent, &o2)
	if o1.ID != 1 || o2.ID != 2 {
		t.Fatalf("ids %d, %d", o1.ID, o2.ID)
	}
	// ... but the receipt is the takeover's.
	third := mustCall(t, cs, key, "create_item", args)
	remarshal(t, third.StructuredContent, &o3)
	if !isReplay(third) || o3.ID != 2 {
		t.Fatalf("replay %+v (replayed %v), want the takeover's result", o3, isReplay(third))
	}
}
