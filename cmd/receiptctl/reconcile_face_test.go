package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/receiptstore/receipts/receiptmcp"
)

// faceService is a service's node on a store: receipthttp in front of a
// handler that fails (5xx: the claim is abandoned) until told to succeed,
// and receiptmcp in front of a tool that fails with an unknown outcome.
type faceService struct {
	t    *testing.T
	db   *receipts.DB
	http http.Handler
	mcp  *mcp.ClientSession
	runs int
}

func newFaceService(t *testing.T, db *receipts.DB) *faceService {
	t.Helper()
	s := &faceService{t: t, db: db}
	quiet := slog.New(slog.DiscardHandler)
	mw, err := receipthttp.New(db, receipthttp.Config{Logger: quiet,
		Scope: func(*http.Request) (string, error) { return "alice", nil }})
	require.NoError(t, err)
	s.http = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs++
		http.Error(w, "upstream timed out", http.StatusGatewayTimeout)
	}))
	srv := mcp.NewServer(&mcp.Implementation{Name: "svc", Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	tool := &mcp.Tool{Name: "create_item", InputSchema: json.RawMessage(`{"type":"object"}`)}
	srv.AddTool(tool, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.runs++
		return nil, errors.New("connection reset while writing")
	})
	srv.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "agent", Wait: -1, Logger: quiet,
		Policies: receiptmcp.PoliciesFor(tool)}))
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	require.NoError(t, err)
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	s.mcp, err = client.Connect(context.Background(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.mcp.Close()
		_ = ss.Wait()
	})
	return s
}

// post sends POST /items with Idempotency-Key key.
func (s *faceService) post(key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/items", strings.NewReader(`{"title":"a"}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	s.http.ServeHTTP(w, r)
	return w
}

// call calls create_item with the operation key.
func (s *faceService) call(key string) (*mcp.CallToolResult, error) {
	ctx := receiptmcp.WithOperationKey(context.Background(), key)
	return s.mcp.CallTool(ctx, &mcp.CallToolParams{Name: "create_item", Arguments: map[string]any{"title": "a"}})
}

// abandon leaves a claim of each front end abandoned: alice/op-4
// (receipthttp, a 504) and agent/op-9 (receiptmcp, an unknown error).
func (s *faceService) abandon() {
	s.t.Helper()
	require.Equal(s.t, http.StatusGatewayTimeout, s.post("op-4").Code)
	_, err := s.call("op-9")
	require.Error(s.t, err)
	require.Equal(s.t, 2, s.runs)
}

// checkSettled requires the retries of both keys to be replays of what
// reconcile stored, with no handler run.
func (s *faceService) checkSettled() {
	s.t.Helper()
	w := s.post("op-4")
	require.Equal(s.t, http.StatusCreated, w.Code, w.Body.String())
	require.Equal(s.t, `{"id":7}`, w.Body.String())
	require.Equal(s.t, "application/json", w.Header().Get("Content-Type"))
	require.Equal(s.t, "true", w.Header().Get(receipthttp.ReplayedHeader))
	res, err := s.call("op-9")
	require.NoError(s.t, err)
	require.Equal(s.t, true, res.Meta[receiptmcp.DefaultReplayMetaKey])
	require.Len(s.t, res.Content, 1)
	require.Equal(s.t, "created 7", res.Content[0].(*mcp.TextContent).Text)
	require.Equal(s.t, 2, s.runs, "a retry ran the handler")
}

// testReconcileFaces: reconcile lists each front end's abandoned key with its
// face, refuses to store a raw result (or the other face's form) for one,
// writing nothing, and stores what its front end replays with --http-status
// and --mcp-result. resume returns the service's node after it.
func testReconcileFaces(t *testing.T, store []string, resume func() *faceService) {
	rows := reconcileRows(t, store)
	faces := map[string]string{}
	for _, r := range rows {
		faces[r.Scope+"/"+r.ID] = r.Face
	}
	require.Equal(t, map[string]string{"alice/op-4": "receipthttp", "agent/op-9": "receiptmcp"}, faces)
	table := cli(t, pgArgs(store, "reconcile")...).requireCode(t, exitOK)
	require.Regexp(t, `op-4\s.*\sreceipthttp\s+-\n`, table.out) // no steps: STEP is -

	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"alice", "op-4", "--commit", `{"x":1}`}, exitProblem, "claimed by receipthttp"},
		{[]string{"alice", "op-4", "--fail", "declined"}, exitProblem, "claimed by receipthttp"},
		{[]string{"alice", "op-4", "--mcp-result", `{"content":[]}`}, exitProblem, "--http-status"},
		{[]string{"agent", "op-9", "--commit", "x"}, exitProblem, "claimed by receiptmcp"},
		{[]string{"agent", "op-9", "--http-status", "201"}, exitProblem, "--mcp-result"},
		{[]string{"alice", "op-4", "--http-status", "500"}, exitUsage, "no outcome"},
		{[]string{"alice", "op-4", "--http-status", "409"}, exitUsage, "--not-performed"},
		{[]string{"alice", "op-4", "--http-status", "201", "--http-header", "no colon"}, exitUsage, "Name: value"},
		{[]string{"alice", "op-4", "--http-body", "x"}, exitUsage, "go with --http-status"},
		{[]string{"agent", "op-9", "--mcp-result", "not json"}, exitUsage, "not a tool result"},
	} {
		r := cli(t, pgArgs(store, append([]string{"reconcile"}, c.args...)...)...).requireCode(t, c.code)
		require.Contains(t, r.stderr, c.msg, "%v", c.args)
	}
	require.Equal(t, rows, reconcileRows(t, store), "nothing written by the refused ones")

	r := cli(t, pgArgs(store, "reconcile", "alice", "op-4", "--json", "--http-status", "201",
		"--http-header", "Content-Type: application/json", "--http-body", `{"id":7}`)...).requireCode(t, exitOK)
	var res reconcileResult
	require.NoError(t, json.Unmarshal([]byte(r.out), &res), r.out)
	require.Equal(t, "receipthttp", res.Face)
	require.Equal(t, "succeeded", res.Settled)
	r = cli(t, pgArgs(store, "reconcile", "agent", "op-9", "--mcp-result",
		`{"content":[{"type":"text","text":"created 7"}],"structuredContent":{"id":7}}`)...).requireCode(t, exitOK)
	require.Contains(t, r.out, "recorded succeeded")
	require.Empty(t, reconcileRows(t, store))
	resume().checkSettled()
}

func TestReconcileFaces(t *testing.T) {
	dir := t.TempDir()
	open := func() *faceService {
		db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newFaceService(t, db)
	}
	svc := open()
	svc.abandon()
	require.NoError(t, svc.db.Close()) // receiptctl opens the directory
	testReconcileFaces(t, []string{"--dir", dir}, func() *faceService {
		next := open()
		next.runs = svc.runs
		return next
	})
}

// On PostgreSQL the service's two nodes stay up while receiptctl settles
// next to them: node A abandoned the claims, node B answers the retries.
func TestPGReconcileFaces(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	a := newFaceService(t, openPGStore(t, dsn, schema, receipts.Options{}))
	b := newFaceService(t, openPGStore(t, dsn, schema, receipts.Options{}))
	a.abandon()
	testReconcileFaces(t, []string{"--pg", dsn, "--schema", schema}, func() *faceService {
		b.runs = a.runs
		return b
	})
}
