package receiptstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptmcp"
	"github.com/stretchr/testify/require"
)

// RunMCP runs the conformance suite of the MCP front end (package
// receiptmcp) against s: two nodes of a service, each an MCP go-sdk server
// with its own receiptmcp middleware behind streamable HTTP with bearer
// authentication (the token's UserID is the scope), on real httptest
// servers, and real go-sdk clients with receiptmcp.ClientMiddleware. The
// nodes share one store: two handles on it if s implements Nodes
// (PostgreSQL), else one *receipts.DB. Subtests are named by behaviour;
// each opens its own store with the kit's options and clock.
//
//	func TestMCPConformance(t *testing.T) {
//		receiptstest.RunMCP(t, myStore{})
//	}
func RunMCP(t *testing.T, s Store) { runFaces(t, s, mcpTests) }

var mcpTests = []faceTest{
	{"RetryOnTheOtherNodeIsReplayed", testMCPRetryOtherNode},
	{"RacingRetriesOnBothNodesRunOnce", testMCPRacingRetries},
	{"SameKeyOtherArgumentsIsConflict", testMCPKeyConflict},
	{"InProgressWithRetryAfter", testMCPInProgress},
	{"DuplicateWaitsOnTheOtherNode", testMCPWaitOtherNode},
	{"ExpiredKeyIsRefused", testMCPExpired},
	{"CloseDuringToolCallKeepsReceipt", testMCPCloseDuringCall},
	{"StagedEffectCommitsWithTheReceipt", testMCPEffect},
	{"SettledByHandIsReplayed", testMCPSettledByHand},
	{"StepsResumeOnTheOtherNode", testMCPStepsResume},
	{"StepMismatchIsRefused", testMCPStepMismatch},
}

// mcpFace is two nodes serving the kit's MCP tool.
type mcpFace struct {
	*faceEnv
	runs  runs
	gate  atomic.Pointer[gate]
	steps faceSteps // the steps the tool runs, for the keys a test plans

	mu sync.Mutex
	fx map[string]receipts.Effect // protected by mu: the effects itemIn.Effect names
}

// effect makes the effect the tool stages for itemIn.Effect name: one that
// records records (see effects.make). A retry carries the same arguments,
// so a test that tells two attempts' effects apart changes records between
// them.
func (m *mcpFace) effect(x *effects, name, records string, fail bool) {
	m.t.Helper()
	e := x.make(m.t, records, fail)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fx == nil {
		m.fx = map[string]receipts.Effect{}
	}
	m.fx[name] = e
}

// createItem is the kit's tool: it has no annotations, so PolicyFor makes
// the operation key Required.
var createItem = &mcp.Tool{Name: "create_item", Description: "Creates a work item."}

// crashItem fails with an error that is not a JSON-RPC error: its outcome
// is unknown, and the middleware abandons its claim.
var crashItem = &mcp.Tool{Name: "crash_item", Description: "Fails with an unknown outcome.", InputSchema: json.RawMessage(`{"type":"object"}`)}

// itemIn is the tool's input: the item's title, and what the kit asks of
// the tool: the effect to stage (made by the test with m.effect), a refusal
// (an isError result), and not waiting at the test's gate.
type itemIn struct {
	Title  string `json:"title"`
	Effect string `json:"effect,omitempty"`
	Refuse bool   `json:"refuse,omitempty"`
}

// itemOut is the tool's structured result: the item, and the attempt that
// created it.
type itemOut struct {
	item
	Attempt   uint32 `json:"attempt"`
	Recovered bool   `json:"recovered"`
}

func newMCPFace(f *faceEnv) *mcpFace { return &mcpFace{faceEnv: f} }

// serve starts node on db with cfg (Policies and Logger filled in), behind
// bearer authentication, until the test ends.
func (m *mcpFace) serve(node string, db *receipts.DB, cfg receiptmcp.Config) *httptest.Server {
	m.t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	if cfg.Policies == nil {
		cfg.Policies = receiptmcp.PoliciesFor(createItem, crashItem)
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "receiptstest-" + node, Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	mcp.AddTool(s, createItem, func(ctx context.Context, req *mcp.CallToolRequest, in itemIn) (*mcp.CallToolResult, itemOut, error) {
		n := m.runs.add()
		m.gate.Load().pass()
		a, ok := receiptmcp.AttemptFrom(ctx)
		if !ok {
			return nil, itemOut{}, errors.New("no Attempt in the tool's context")
		}
		if in.Effect != "" {
			m.mu.Lock()
			e := m.fx[in.Effect]
			m.mu.Unlock()
			if e == nil {
				return nil, itemOut{}, errors.New("no effect " + in.Effect)
			}
			a.Stage(e)
		}
		if in.Refuse {
			return nil, itemOut{}, fmt.Errorf("refused %q (run %d)", in.Title, n) // isError
		}
		var steps []string
		if p, ok := m.steps.planned(a.Key.ID); ok {
			out, err := m.steps.run(ctx, a.Key.ID, p, a.Step)
			if err != nil {
				return nil, itemOut{}, err
			}
			steps = out
		}
		return nil, itemOut{item: item{ID: n, Title: in.Title, Node: node, Steps: steps}, Attempt: a.Number, Recovered: a.Recovered}, nil
	})
	s.AddTool(crashItem, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		m.runs.add()
		return nil, errors.New("connection reset while writing")
	})
	s.AddReceivingMiddleware(receiptmcp.Middleware(db, cfg))
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Logger: quiet})
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		user, ok := strings.CutPrefix(token, "tok-")
		if !ok || user == "" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
	}
	srv := httptest.NewServer(auth.RequireBearerToken(verify, nil)(h))
	m.t.Cleanup(srv.Close)
	return srv
}

// nodes serves node A on the store's first handle and node B on the other.
func (m *mcpFace) nodes(cfg receiptmcp.Config) (a, b *httptest.Server) {
	return m.serve("a", m.db, cfg), m.serve("b", m.b, cfg)
}

// bearerTransport adds a bearer token to every request.
type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// connect connects a host to srv as user, until the test ends.
func (m *mcpFace) connect(srv *httptest.Server, user string) *mcp.ClientSession {
	m.t.Helper()
	tr := &http.Transport{}
	m.t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: &bearerTransport{token: "tok-" + user, next: tr}}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(bg, &mcp.StreamableClientTransport{
		Endpoint: srv.URL, HTTPClient: hc, DisableStandaloneSSE: true, MaxRetries: -1,
	}, nil)
	require.NoError(m.t, err, "connect to %s", srv.URL)
	m.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// mcpAnswer is what a tool call returned.
type mcpAnswer struct {
	res *mcp.CallToolResult
	err error
}

// callItem calls create_item with the operation key and title.
func callItem(cs *mcp.ClientSession, key, title string) mcpAnswer {
	return callWith(cs, key, itemIn{Title: title})
}

// callWith calls create_item with the operation key and input in.
func callWith(cs *mcp.ClientSession, key string, in itemIn) mcpAnswer {
	ctx, cancel := context.WithTimeout(receiptmcp.WithOperationKey(bg, key), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: createItem.Name, Arguments: in})
	return mcpAnswer{res, err}
}

func callAsync(cs *mcp.ClientSession, key, title string) <-chan mcpAnswer {
	return callAsyncWith(cs, key, itemIn{Title: title})
}

func callAsyncWith(cs *mcp.ClientSession, key string, in itemIn) <-chan mcpAnswer {
	ch := make(chan mcpAnswer, 1)
	go func() { ch <- callWith(cs, key, in) }()
	return ch
}

func mcpReplayed(res *mcp.CallToolResult) bool {
	v, _ := res.Meta[receiptmcp.DefaultReplayMetaKey].(bool)
	return v
}

// mcpComparable is res as JSON without the _meta entries a replay adds.
func mcpComparable(t testing.TB, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
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

// wantMCPFirst requires a to be a first, finished result and returns its
// item.
func wantMCPFirst(t testing.TB, a mcpAnswer, what string) itemOut {
	t.Helper()
	require.NoError(t, a.err, "%s", what)
	require.False(t, a.res.IsError, "%s: isError: %+v", what, a.res.Content)
	require.False(t, mcpReplayed(a.res), "%s: a first answer marked as a replay", what)
	b, err := json.Marshal(a.res.StructuredContent)
	require.NoError(t, err)
	var it itemOut
	require.NoError(t, json.Unmarshal(b, &it), "%s", what)
	return it
}

// wantMCPReplay requires a to replay first, with the replay's _meta.
func wantMCPReplay(t testing.TB, first *mcp.CallToolResult, a mcpAnswer, what string) {
	t.Helper()
	require.NoError(t, a.err, "%s", what)
	require.True(t, mcpReplayed(a.res), "%s: not marked as a replay: %v", what, a.res.Meta)
	require.Equal(t, mcpComparable(t, first), mcpComparable(t, a.res), "%s: the replay differs", what)
	var at [2]time.Time
	for i, k := range []string{receiptmcp.RecordedAtMetaKey, receiptmcp.ExpiresAtMetaKey} {
		s, _ := a.res.Meta[k].(string)
		var err error
		at[i], err = time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err, "%s: _meta %s = %q", what, k, s)
	}
	require.True(t, at[1].After(at[0]), "%s: expires %s, recorded %s", what, at[1], at[0])
}

// wantMCPError requires a to be the middleware's error with code and type.
func wantMCPError(t testing.TB, a mcpAnswer, code int64, typ, what string) *receiptmcp.ErrorData {
	t.Helper()
	require.Error(t, a.err, "%s: want code %d type %s", what, code, typ)
	got, data, ok := receiptmcp.ParseError(a.err)
	require.True(t, ok, "%s: not the middleware's error: %v", what, a.err)
	require.Equal(t, code, got, "%s: %v", what, a.err)
	require.Equal(t, typ, data.Type, "%s: %v", what, a.err)
	return data
}

// mcpStarted waits for a tool handler to arrive at g, failing at once with
// the answer if pending is answered first (the tool never ran).
func mcpStarted(t testing.TB, g *gate, pending <-chan mcpAnswer) {
	t.Helper()
	select {
	case <-g.arrived:
	case a := <-pending:
		t.Fatalf("answered before the tool started: %+v, %v", a.res, a.err)
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the tool to start")
	}
}

// A retry that lands on the other node, from a session of its own, is
// answered from the receipt the first node stored, marked replayed, and the
// tool ran once.
func testMCPRetryOtherNode(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	key := receiptmcp.NewOperationKey()
	first := callItem(csA, key, "Fix the login page")
	it := wantMCPFirst(t, first, "first call on node A")
	require.Equal(t, "a", it.Node)
	for i, cs := range []*mcp.ClientSession{csB, m.connect(b, "alice"), csA} {
		wantMCPReplay(t, first.res, callItem(cs, key, "Fix the login page"), fmt.Sprintf("retry %d", i))
	}
	m.runs.want(t, 1, "a call and three retries")
	for _, db := range []*receipts.DB{f.db, f.b} {
		r, err := db.Lookup(bg, receipts.Key{Scope: "alice", ID: key})
		require.NoError(t, err)
		require.Equal(t, receipts.Succeeded, r.State)
	}
	// Another principal's key of the same name is its own operation.
	wantMCPFirst(t, callItem(m.connect(b, "bob"), key, "Fix the login page"), "bob's call on node B")
	m.runs.want(t, 2, "after bob's call")
}

// Retries racing on both nodes run the tool once: while the first runs
// (it waits until every other retry has been answered), every other gets
// CodeInProgress, and afterwards every retry is its replay.
func testMCPRacingRetries(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{Wait: -1})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	g := newGate()
	m.gate.Store(g)
	defer g.Open()
	const n = 8
	key := receiptmcp.NewOperationKey()
	got := make(chan mcpAnswer, n)
	var wg sync.WaitGroup
	for i := range n {
		cs := csA
		if i%2 == 1 {
			cs = csB
		}
		ch := callAsync(cs, key, "race")
		wg.Add(1)
		go func() { defer wg.Done(); got <- recv(t, ch, "an answer") }()
	}
	// The bound only ends a test that has already failed (a second run
	// waits here too).
	var answers []mcpAnswer
	deadline := time.After(10 * time.Second)
collect:
	for len(answers) < n-1 {
		select {
		case a := <-got:
			answers = append(answers, a)
		case <-deadline:
			break collect
		}
	}
	g.Open()
	wg.Wait()
	close(got)
	for a := range got {
		answers = append(answers, a)
	}
	var firsts []mcpAnswer
	for i, ans := range answers {
		if ans.err == nil {
			wantMCPFirst(t, ans, fmt.Sprintf("answer %d", i))
			firsts = append(firsts, ans)
			continue
		}
		wantMCPError(t, ans, receiptmcp.CodeInProgress, receiptmcp.TypeInProgress, fmt.Sprintf("answer %d", i))
	}
	m.runs.want(t, 1, fmt.Sprintf("%d racing calls", n))
	require.Len(t, firsts, 1, "first answers")
	for _, cs := range []*mcp.ClientSession{csA, csB} {
		wantMCPReplay(t, firsts[0].res, callItem(cs, key, "race"), "a retry after the race")
	}
	m.runs.want(t, 1, "after the retries")
}

// The same key with other arguments is refused on either node (invalid
// params, idempotency_key_conflict) and the tool does not run; the original
// arguments are still replayed.
func testMCPKeyConflict(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	key := receiptmcp.NewOperationKey()
	first := callItem(csA, key, "a")
	wantMCPFirst(t, first, "first call")
	for _, cs := range []*mcp.ClientSession{csB, csA} {
		wantMCPError(t, callItem(cs, key, "b"), receiptmcp.CodeInvalidParams, receiptmcp.TypeKeyConflict, "other arguments")
	}
	m.runs.want(t, 1, "after the conflicts")
	wantMCPReplay(t, first.res, callItem(csB, key, "a"), "the original arguments")
}

// While the first call runs on node A, the same key on either node (not
// waiting) gets CodeInProgress with retryAfterMs of at least 1 and at most
// the lease; once it is answered, the retry on node B is its replay.
func testMCPInProgress(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{Wait: -1})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	g := newGate()
	m.gate.Store(g)
	defer g.Open()
	key := receiptmcp.NewOperationKey()
	pending := callAsync(csA, key, "slow")
	mcpStarted(t, g, pending)
	for _, cs := range []*mcp.ClientSession{csB, csA} {
		d := wantMCPError(t, callItem(cs, key, "slow"), receiptmcp.CodeInProgress, receiptmcp.TypeInProgress, "a duplicate while running")
		require.GreaterOrEqual(t, d.RetryAfterMs, int64(1))
		require.LessOrEqual(t, d.RetryAfter(), leaseTTL)
	}
	g.Open()
	first := recv(t, pending, "the first answer")
	wantMCPFirst(t, first, "the first call")
	wantMCPReplay(t, first.res, callItem(csB, key, "slow"), "the retry")
	m.runs.want(t, 1, "after the retry")
}

// With Config.Wait, a duplicate on node B waits for the call running on
// node A and gets its replay.
func testMCPWaitOtherNode(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{Wait: 20 * time.Second})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	g := newGate()
	m.gate.Store(g)
	defer g.Open()
	key := receiptmcp.NewOperationKey()
	pending := callAsync(csA, key, "slow")
	mcpStarted(t, g, pending)
	waiting := callAsync(csB, key, "slow")
	letWaitersWait()
	g.Open()
	first := recv(t, pending, "the first answer")
	wantMCPFirst(t, first, "the first call")
	wantMCPReplay(t, first.res, recv(t, waiting, "the waiting duplicate"), "the waiting duplicate")
	m.runs.want(t, 1, "after the duplicate")
}

// Past the receipt's retention, within the store's tombstone window, the
// key is refused on both nodes (CodeExpired, idempotency_key_expired),
// whatever the arguments, and the tool does not run; after the window the
// key is a new call.
func testMCPExpired(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	key := receiptmcp.NewOperationKey()
	wantMCPFirst(t, callItem(csA, key, "a"), "first call")
	window := f.window()
	if window == 0 {
		t.Skip("the engine keeps no tombstones (TombstoneWindow 0): nothing is refused as expired")
	}
	f.clock.Advance(retention)
	for _, cs := range []*mcp.ClientSession{csB, csA} {
		for _, title := range []string{"a", "other"} {
			wantMCPError(t, callItem(cs, key, title), receiptmcp.CodeExpired, receiptmcp.TypeKeyExpired, "after retention")
		}
	}
	m.runs.want(t, 1, "after retention")
	f.clock.Advance(window)
	wantMCPFirst(t, callItem(csB, key, "a"), "after the tombstone window")
	m.runs.want(t, 2, "after the tombstone window")
}

// Closing node A's store while its tool runs waits for the tool and keeps
// its receipt: the host gets the result, Close returns nil, and the retry
// (on node B, or on node A restarted) is its replay.
func testMCPCloseDuringCall(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	csA := m.connect(m.serve("a", f.db, receiptmcp.Config{}), "alice")
	g := newGate()
	m.gate.Store(g)
	defer g.Open()
	key := receiptmcp.NewOperationKey()
	pending := callAsync(csA, key, "during close")
	mcpStarted(t, g, pending)
	closing := f.db
	closed := make(chan error, 1)
	go func() { closed <- closing.Close() }()
	closeBegun(t, closing)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while the tool was running", err)
	default:
	}
	g.Open()
	first := recv(t, pending, "the answer")
	wantMCPFirst(t, first, "the call Close waited for")
	require.NoError(t, recv(t, closed, "Close"))

	csB := m.connect(m.serve("b", f.afterClose(), receiptmcp.Config{}), "alice")
	wantMCPReplay(t, first.res, callItem(csB, key, "during close"), "the retry after Close")
	m.runs.want(t, 1, "after the retry")
}

// An effect the tool stages (Attempt.Stage) commits with the stored result,
// both or neither, as both nodes read it:
//   - a result: the effect and the Succeeded receipt; the retry on node B
//     is the replay, and the tool ran once;
//   - an isError result (a Failed receipt): the receipt, not the effect;
//   - an effect that fails after it wrote: neither (CodeNotRecorded, the
//     claim abandoned), and the retry runs Recovered and commits both;
//   - a stale holder (its lease ran out and node B took the key over) that
//     answers after the takeover: its effect is not written, and the key
//     keeps the effect and the receipt of the attempt that took over.
func testMCPEffect(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	x := newEffects(t, f)
	a, b := m.nodes(receiptmcp.Config{Wait: -1})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	lookup := func(id string) *receipts.Receipt {
		t.Helper()
		r, err := f.b.Lookup(bg, receipts.Key{Scope: "alice", ID: id})
		require.NoError(t, err)
		return r
	}

	m.effect(x, "e-ok", "e-ok", false)
	ok := itemIn{Title: "ok", Effect: "e-ok"}
	first := callWith(csA, "op-ok", ok)
	wantMCPFirst(t, first, "a call with an effect")
	require.True(t, x.has(t, "e-ok"), "the effect of a stored result")
	require.Equal(t, receipts.Succeeded, lookup("op-ok").State)
	wantMCPReplay(t, first.res, callWith(csB, "op-ok", ok), "the retry on node B")
	m.runs.want(t, 1, "a call and its retry")

	m.effect(x, "e-refused", "e-refused", false)
	refused := itemIn{Title: "no", Effect: "e-refused", Refuse: true}
	failed := callWith(csA, "op-refused", refused)
	require.NoError(t, failed.err)
	require.True(t, failed.res.IsError, "a refusal is an isError result")
	require.False(t, x.has(t, "e-refused"), "the effect of an isError result")
	require.Equal(t, receipts.Failed, lookup("op-refused").State)
	wantMCPReplay(t, failed.res, callWith(csB, "op-refused", refused), "the retry of a refused call")

	m.effect(x, "e-boom", "e-boom", true)
	boom := itemIn{Title: "boom", Effect: "e-boom"}
	wantMCPError(t, callWith(csA, "op-boom", boom), receiptmcp.CodeNotRecorded, receiptmcp.TypeNotRecorded, "a call whose effect failed")
	require.False(t, x.has(t, "e-boom"), "an effect that failed after it wrote")
	rec := lookup("op-boom")
	require.Equal(t, receipts.Pending, rec.State, "nothing stored for a call whose effect failed")
	require.True(t, rec.Abandoned(f.clock.Now()), "its outcome is unknown: the claim is abandoned")
	m.effect(x, "e-boom", "e-boom-retry", false) // the retry's effect works
	retry := callWith(csB, "op-boom", boom)
	require.True(t, wantMCPFirst(t, retry, "the retry after the failed effect").Recovered, "the retry runs Recovered")
	require.True(t, x.has(t, "e-boom-retry"))
	require.False(t, x.has(t, "e-boom"))
	wantMCPReplay(t, retry.res, callWith(csA, "op-boom", boom), "the replay of the retry")

	g := newGate()
	g.hold = 1 // only the first call waits
	m.gate.Store(g)
	defer g.Open()
	m.effect(x, "e-stale", "e-stale", false)
	stalled := itemIn{Title: "stale", Effect: "e-stale"}
	stale := callAsyncWith(csA, "op-stale", stalled)
	mcpStarted(t, g, stale)
	f.clock.Advance(leaseTTL + time.Second) // node A's lease runs out (its process stalled)
	m.effect(x, "e-stale", "e-took-over", false)
	took := callWith(csB, "op-stale", stalled)
	require.True(t, wantMCPFirst(t, took, "the retry that took the key over").Recovered)
	g.Open()
	late := recv(t, stale, "the stale holder's answer")
	t.Logf("the stale holder answered %+v, %v", late.res, late.err)
	require.Error(t, late.err, "the stale holder answered as if it had stored its result")
	require.False(t, x.has(t, "e-stale"), "a stale holder's effect")
	require.True(t, x.has(t, "e-took-over"), "the effect of the attempt that took over")
	wantMCPReplay(t, took.res, callWith(csA, "op-stale", stalled), "the key after both answered")
}

// A claim abandoned on node A (the tool failed with an unknown outcome) and
// settled by hand on node B, as an operator or a reconciler would
// (DB.TakeOver, then receiptmcp.SettleResult), is replayed on node A as
// the result it was settled with; the record tells that the middleware
// owns the key.
func testMCPSettledByHand(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	csA := m.connect(m.serve("a", f.db, receiptmcp.Config{Wait: -1}), "alice")
	call := func() mcpAnswer {
		ctx, cancel := context.WithTimeout(receiptmcp.WithOperationKey(bg, "op-4"), 30*time.Second)
		defer cancel()
		res, err := csA.CallTool(ctx, &mcp.CallToolParams{Name: crashItem.Name, Arguments: map[string]any{"title": "a"}})
		return mcpAnswer{res, err}
	}
	require.Error(t, call().err, "a tool that failed")
	r, err := f.b.Lookup(bg, receipts.Key{Scope: "alice", ID: "op-4"})
	require.NoError(t, err)
	require.True(t, r.Abandoned(f.clock.Now()), "an unknown outcome abandons the claim")
	require.True(t, receiptmcp.Owns(r), "the record of a receiptmcp key")
	l, err := f.b.TakeOver(bg, r)
	require.NoError(t, err)
	_, err = receiptmcp.SettleResult(bg, l, nil)
	require.ErrorIs(t, err, receiptmcp.ErrInvalidResult)
	settled := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "created 7"}}, StructuredContent: map[string]any{"id": 7}}
	_, err = receiptmcp.SettleResult(bg, l, settled)
	require.NoError(t, err)
	got := call()
	require.NoError(t, got.err)
	require.True(t, mcpReplayed(got.res))
	require.Len(t, got.res.Content, 1)
	require.Equal(t, "created 7", got.res.Content[0].(*mcp.TextContent).Text)
	require.Equal(t, map[string]any{"id": 7.0}, got.res.StructuredContent)
	m.runs.want(t, 1, "after the retry")
}

// A tool of three steps (reserve, charge, notify) whose third step's reply
// is lost on node A (the provider performed it): the client gets
// CodeNotRecorded naming the step in data.step, not the tool's answer, and
// the claim is abandoned with the journal holding reserve and charge done
// and notify started. The retry on node B resumes: reserve and charge are
// not run again, notify runs Recovered with the same Step.ProviderKey (the
// provider, which deduplicates by it, performs it once), and the result is
// stored once: every later retry, on either node, is its replay.
func testMCPStepsResume(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{Wait: -1})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	k := receipts.Key{Scope: "alice", ID: receiptmcp.NewOperationKey()}
	m.steps.plan(k.ID, tripSteps, "notify")
	d := wantMCPError(t, callItem(csA, k.ID, "trip"), receiptmcp.CodeNotRecorded, receiptmcp.TypeNotRecorded, "a call whose step's reply was lost")
	require.Equal(t, "notify", d.Step, "data.step names the uncertain step")
	require.Positive(t, d.RetryAfterMs)
	wantJournal(t, f.b, k, tripSteps, []receipts.State{receipts.Succeeded, receipts.Succeeded, receipts.Pending}, "after the lost reply")
	rec, err := f.b.Lookup(bg, k)
	require.NoError(t, err)
	require.True(t, rec.Abandoned(f.clock.Now()), "the uncertain step abandons the claim")

	m.steps.plan(k.ID, tripSteps, "") // the provider answers this time
	retry := callItem(csB, k.ID, "trip")
	out := wantMCPFirst(t, retry, "the retry on node B")
	require.Equal(t, "b", out.Node)
	require.True(t, out.Recovered, "the retry runs Recovered")
	require.Equal(t, []string{"reserve done", "charge done", "notify done"}, out.Steps)
	m.steps.wantResumed(t, k.ID)
	for i, cs := range []*mcp.ClientSession{csA, csB} {
		wantMCPReplay(t, retry.res, callItem(cs, k.ID, "trip"), fmt.Sprintf("retry %d after the resumed one", i))
	}
	m.runs.want(t, 2, "a call, its resumed retry and two replays")
	m.steps.wantResumed(t, k.ID)
	wantJournal(t, f.db, k, tripSteps, []receipts.State{receipts.Succeeded, receipts.Succeeded, receipts.Succeeded}, "after the retry")
}

// A retry whose tool calls another step than the key's journal holds at
// its position (the server was changed while the call was in flight) gets
// TypeStepMismatch naming the step in data.step, on either node: no step's
// fn runs, the journal is unchanged and the claim stays abandoned. A retry
// that calls the recorded steps again resumes at the uncertain one.
func testMCPStepMismatch(t *testing.T, f *faceEnv) {
	m := newMCPFace(f)
	a, b := m.nodes(receiptmcp.Config{Wait: -1})
	csA, csB := m.connect(a, "alice"), m.connect(b, "alice")
	k := receipts.Key{Scope: "alice", ID: receiptmcp.NewOperationKey()}
	m.steps.plan(k.ID, tripSteps, "charge")
	d := wantMCPError(t, callItem(csA, k.ID, "trip"), receiptmcp.CodeNotRecorded, receiptmcp.TypeNotRecorded, "a lost reply")
	require.Equal(t, "charge", d.Step)

	m.steps.plan(k.ID, []string{"reserve", "refund", "notify"}, "")
	for _, cs := range []*mcp.ClientSession{csB, csA} {
		d := wantMCPError(t, callItem(cs, k.ID, "trip"), receiptmcp.CodeInternal, receiptmcp.TypeStepMismatch, "a retry that calls another step")
		require.Equal(t, "refund", d.Step, "data.step names the step that does not match")
	}
	wantMismatchChangedNothing(t, f, &m.steps, k)

	m.steps.plan(k.ID, tripSteps, "")
	out := wantMCPFirst(t, callItem(csB, k.ID, "trip"), "a retry with the recorded steps")
	require.Equal(t, []string{"reserve done", "charge done", "notify done"}, out.Steps)
	charge := m.steps.stepRuns(k.ID, "charge")
	require.Len(t, charge, 2)
	require.True(t, charge[1].recovered, "the uncertain step runs Recovered")
	require.Len(t, m.steps.stepRuns(k.ID, "reserve"), 1, "a finished step never runs again")
}
