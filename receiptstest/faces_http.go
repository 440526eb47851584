package receiptstest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/stretchr/testify/require"
)

// RunHTTP runs the conformance suite of the HTTP front end (package
// receipthttp) against s: real net/http servers (httptest.Server) for two
// nodes of a service, each with its own receipthttp middleware, and a real
// http.Client. The nodes share one store: two handles on it if s implements
// Nodes (PostgreSQL), else one *receipts.DB. Subtests are named by
// behaviour (for example "RetryOnTheOtherNodeIsReplayed"); each opens its
// own store with the kit's options and clock.
//
//	func TestHTTPConformance(t *testing.T) {
//		receiptstest.RunHTTP(t, myStore{})
//	}
func RunHTTP(t *testing.T, s Store) { runFaces(t, s, httpTests) }

var httpTests = []faceTest{
	{"RetryOnTheOtherNodeIsReplayed", testHTTPRetryOtherNode},
	{"RacingRetriesOnBothNodesRunOnce", testHTTPRacingRetries},
	{"SameKeyOtherBodyIs422", testHTTPKeyReused},
	{"InProgressIs409WithRetryAfter", testHTTPInProgress},
	{"DuplicateWaitsOnTheOtherNode", testHTTPWaitOtherNode},
	{"ExpiredKeyIs410", testHTTPExpired},
	{"CloseDuringHandlerKeepsReceipt", testHTTPCloseDuringHandler},
	{"StagedEffectCommitsWithTheReceipt", testHTTPEffect},
	{"SettledByHandIsReplayed", testHTTPSettledByHand},
	{"StepsResumeOnTheOtherNode", testHTTPStepsResume},
	{"StepMismatchIsRefused", testHTTPStepMismatch},
}

// httpFace is two nodes serving the kit's HTTP application.
type httpFace struct {
	*faceEnv
	runs   runs
	gate   atomic.Pointer[gate]
	client *http.Client
	steps  faceSteps // the steps the application runs, for the keys a test plans

	mu sync.Mutex
	fx map[string]receipts.Effect // protected by mu: the effects X-Effect names
}

// httpResp is what a client got.
type httpResp struct {
	status int
	header http.Header
	body   []byte
}

func (r httpResp) replayed() bool { return r.header.Get(receipthttp.ReplayedHeader) == "true" }

// item is the body the kit's application answers with.
type item struct {
	ID    int64    `json:"id"`
	Title string   `json:"title"`
	Node  string   `json:"node"`
	Steps []string `json:"steps,omitempty"` // the results of the steps the test planned
}

func newHTTPFace(t *testing.T, f *faceEnv) *httpFace {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &httpFace{faceEnv: f, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// httpScope authenticates by the X-Caller header (the kit's stand-in for a
// real authenticator).
func httpScope(r *http.Request) (string, error) {
	if s := r.Header.Get("X-Caller"); s != "" {
		return s, nil
	}
	return "", errors.New("no X-Caller")
}

// app is the application behind node's middleware: it creates an item from
// the body's title, numbered by its run, and answers 201 with it (or the
// status in X-Status), with X-Attempt and X-Recovered from its Attempt. It
// waits at the test's gate (if any), stages
// the effect named by X-Effect (made by the test with h.effect), and runs
// the steps the test planned for the key (h.steps.plan), answering 500 if
// one fails.
func (h *httpFace) app(node string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.runs.add()
		h.gate.Load().pass()
		a, ok := receipthttp.AttemptFrom(r.Context())
		if !ok {
			http.Error(w, "no Attempt in the handler's context", http.StatusInternalServerError)
			return
		}
		if name := r.Header.Get("X-Effect"); name != "" {
			h.mu.Lock()
			e := h.fx[name]
			h.mu.Unlock()
			if e == nil {
				http.Error(w, "no effect "+name, http.StatusInternalServerError)
				return
			}
			a.Stage(e)
		}
		var in struct {
			Title string `json:"title"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var steps []string
		if p, ok := h.steps.planned(a.Key.ID); ok {
			out, err := h.steps.run(r.Context(), a.Key.ID, p, a.Step)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			steps = out
		}
		status := http.StatusCreated
		if s, err := strconv.Atoi(r.Header.Get("X-Status")); err == nil {
			status = s
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/items/%d", n))
		w.Header().Set("X-Attempt", strconv.FormatUint(uint64(a.Number), 10))
		w.Header().Set("X-Recovered", strconv.FormatBool(a.Recovered))
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(item{ID: n, Title: in.Title, Node: node, Steps: steps})
	})
}

// effect makes the effect the application stages for X-Effect: name (see
// effects.make).
func (h *httpFace) effect(x *effects, name string, fail bool) {
	h.t.Helper()
	e := x.make(h.t, name, fail)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fx == nil {
		h.fx = map[string]receipts.Effect{}
	}
	h.fx[name] = e
}

// serve starts node on db with cfg (Scope and Logger filled in), until the
// test ends.
func (h *httpFace) serve(node string, db *receipts.DB, cfg receipthttp.Config) *httptest.Server {
	h.t.Helper()
	if cfg.Scope == nil {
		cfg.Scope = httpScope
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	mw, err := receipthttp.New(db, cfg)
	require.NoError(h.t, err, "receipthttp.New")
	srv := httptest.NewServer(mw(h.app(node)))
	h.t.Cleanup(srv.Close)
	return srv
}

// nodes serves node A on the store's first handle and node B on the other.
func (h *httpFace) nodes(cfg receipthttp.Config) (a, b *httptest.Server) {
	return h.serve("a", h.db, cfg), h.serve("b", h.b, cfg)
}

// post sends a POST /items with the key (none if "") as caller, with the
// extra request headers hdr, name and value (the kit's application reads
// X-Status and X-Effect).
func (h *httpFace) post(srv *httptest.Server, caller, key, body string, hdr ...string) httpResp {
	h.t.Helper()
	r := h.do(srv, caller, key, body, hdr)
	require.NotEqual(h.t, -1, r.status, "POST %s: %s", srv.URL, r.body)
	return r
}

// postAsync is post from another goroutine; the response arrives on the
// returned channel.
func (h *httpFace) postAsync(srv *httptest.Server, caller, key, body string, hdr ...string) <-chan httpResp {
	ch := make(chan httpResp, 1)
	go func() { ch <- h.do(srv, caller, key, body, hdr) }()
	return ch
}

// do sends the request; a transport error is status -1 with the error as
// body.
func (h *httpFace) do(srv *httptest.Server, caller, key, body string, hdr []string) httpResp {
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/items", bytes.NewReader([]byte(body)))
	if err != nil {
		return httpResp{status: -1, body: []byte(err.Error())}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Caller", caller)
	if key != "" {
		req.Header.Set(receipthttp.DefaultHeader, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return httpResp{status: -1, body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return httpResp{status: -1, body: []byte(err.Error())}
	}
	return httpResp{status: resp.StatusCode, header: resp.Header, body: b}
}

// handlerStarted waits for a handler to arrive at g, failing at once with
// the response if pending is answered first (the handler never ran).
func handlerStarted(t testing.TB, g *gate, pending <-chan httpResp) {
	t.Helper()
	select {
	case <-g.arrived:
	case r := <-pending:
		t.Fatalf("answered %d before the handler started: %s", r.status, r.body)
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the handler to start")
	}
}

// wantStatus requires r to have status want.
func wantStatus(t testing.TB, r httpResp, want int, what string) {
	t.Helper()
	require.Equal(t, want, r.status, "%s: status %d, body %s", what, r.status, r.body)
}

// wantFirst requires r to be a first answer (201, not a replay) and
// returns its item.
func wantFirst(t testing.TB, r httpResp, what string) item {
	t.Helper()
	wantStatus(t, r, http.StatusCreated, what)
	require.False(t, r.replayed(), "%s: a first answer marked as a replay", what)
	var it item
	require.NoError(t, json.Unmarshal(r.body, &it), "%s", what)
	return it
}

// wantReplay requires r to replay first: same status, stored headers and
// body, with the replay headers.
func wantReplay(t testing.TB, first, r httpResp, what string) {
	t.Helper()
	require.Equal(t, first.status, r.status, "%s: body %s", what, r.body)
	require.Equal(t, "true", r.header.Get(receipthttp.ReplayedHeader), "%s: not marked as a replay", what)
	require.Equal(t, string(first.body), string(r.body), "%s: the replay's body", what)
	for _, name := range []string{"Content-Type", "Location"} {
		require.Equal(t, first.header.Get(name), r.header.Get(name), "%s: header %s", what, name)
	}
	rec, err := http.ParseTime(r.header.Get(receipthttp.RecordedAtHeader))
	require.NoError(t, err, "%s: %s", what, receipthttp.RecordedAtHeader)
	exp, err := http.ParseTime(r.header.Get(receipthttp.ExpiresAtHeader))
	require.NoError(t, err, "%s: %s", what, receipthttp.ExpiresAtHeader)
	require.True(t, exp.After(rec), "%s: expires %s, recorded %s", what, exp, rec)
}

// wantProblem requires r to be a problem of type typ with status status.
func wantProblem(t testing.TB, r httpResp, status int, typ, what string) receipthttp.Problem {
	t.Helper()
	wantStatus(t, r, status, what)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "%s", what)
	var p receipthttp.Problem
	require.NoError(t, json.Unmarshal(r.body, &p), "%s: %s", what, r.body)
	require.Equal(t, typ, p.Type, "%s: %s", what, r.body)
	require.Equal(t, status, p.Status, "%s", what)
	return p
}

// A retry that lands on the other node is answered from the receipt the
// first node stored: the same status, headers and body, marked
// Idempotent-Replayed, and the handler ran once. So are retries on the
// first node.
func testHTTPRetryOtherNode(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{})
	first := h.post(a, "alice", "op-1", `{"title":"Fix the login page"}`)
	it := wantFirst(t, first, "first request on node A")
	require.Equal(t, "a", it.Node)
	for i, srv := range []*httptest.Server{b, b, a} {
		wantReplay(t, first, h.post(srv, "alice", "op-1", `{"title":"Fix the login page"}`), fmt.Sprintf("retry %d", i))
	}
	h.runs.want(t, 1, "a request and three retries")
	for _, db := range []*receipts.DB{f.db, f.b} {
		r, err := db.Lookup(bg, key("alice", "op-1"))
		require.NoError(t, err)
		require.Equal(t, receipts.Succeeded, r.State)
	}
	// Another caller's key of the same name is its own operation.
	wantFirst(t, h.post(b, "bob", "op-1", `{"title":"Fix the login page"}`), "bob's request on node B")
	h.runs.want(t, 2, "after bob's request")
}

// Retries racing on both nodes run the handler once: while the first one
// runs (the handler waits until every other retry has been answered), every
// other gets 409, and once it is answered every retry, on either node, is
// its replay.
func testHTTPRacingRetries(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{})
	g := newGate()
	h.gate.Store(g)
	defer g.Open()
	const n = 8
	body := `{"title":"race"}`
	chs := make([]<-chan httpResp, n)
	for i := range n {
		srv := a
		if i%2 == 1 {
			srv = b
		}
		chs[i] = h.postAsync(srv, "alice", "op-race", body)
	}
	got := make(chan httpResp, n)
	var wg sync.WaitGroup
	for _, ch := range chs {
		wg.Add(1)
		go func() { defer wg.Done(); got <- recv(t, ch, "a response") }()
	}
	// The one that runs waits here until the n-1 others are answered (a
	// second run would also wait, so that it overlaps; the bound only ends
	// a test that has already failed).
	var resps []httpResp
	deadline := time.After(10 * time.Second)
collect:
	for len(resps) < n-1 {
		select {
		case r := <-got:
			resps = append(resps, r)
		case <-deadline:
			break collect
		}
	}
	g.Open()
	wg.Wait()
	close(got)
	for r := range got {
		resps = append(resps, r)
	}
	var firsts []httpResp
	for i, r := range resps {
		switch r.status {
		case http.StatusCreated:
			require.False(t, r.replayed(), "response %d: a replay before the first answer", i)
			firsts = append(firsts, r)
		default:
			wantProblem(t, r, http.StatusConflict, receipthttp.ProblemInProgress, fmt.Sprintf("response %d", i))
		}
	}
	h.runs.want(t, 1, fmt.Sprintf("%d racing requests", n))
	require.Len(t, firsts, 1, "first answers")
	for _, srv := range []*httptest.Server{a, b} {
		wantReplay(t, firsts[0], h.post(srv, "alice", "op-race", body), "a retry after the race")
	}
	h.runs.want(t, 1, "after the retries")
}

// The same key with another body is 422 (ProblemKeyReused) on either node,
// and the handler does not run; the original body is still replayed.
func testHTTPKeyReused(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{})
	first := h.post(a, "alice", "op-1", `{"title":"a"}`)
	wantFirst(t, first, "first request")
	for _, srv := range []*httptest.Server{b, a} {
		wantProblem(t, h.post(srv, "alice", "op-1", `{"title":"b"}`), http.StatusUnprocessableEntity, receipthttp.ProblemKeyReused, "another body")
	}
	h.runs.want(t, 1, "after the reuses")
	wantReplay(t, first, h.post(b, "alice", "op-1", `{"title":"a"}`), "the original body")
}

// While the first request runs on node A, the same key on either node gets
// 409 with a Retry-After of whole seconds, at least 1 and at most the lease;
// once it is answered, the retry on node B is its replay.
func testHTTPInProgress(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{})
	g := newGate()
	h.gate.Store(g)
	defer g.Open()
	pending := h.postAsync(a, "alice", "op-1", `{"title":"slow"}`)
	handlerStarted(t, g, pending)
	for _, srv := range []*httptest.Server{b, a} {
		r := h.post(srv, "alice", "op-1", `{"title":"slow"}`)
		wantProblem(t, r, http.StatusConflict, receipthttp.ProblemInProgress, "a duplicate while running")
		secs, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
		require.GreaterOrEqual(t, secs, 1)
		require.LessOrEqual(t, secs, int(leaseTTL/time.Second))
	}
	g.Open()
	first := recv(t, pending, "the first response")
	wantFirst(t, first, "the first request")
	wantReplay(t, first, h.post(b, "alice", "op-1", `{"title":"slow"}`), "the retry")
	h.runs.want(t, 1, "after the retry")
}

// With Config.Wait, a duplicate on node B waits for the request running on
// node A and gets its replay, not 409.
func testHTTPWaitOtherNode(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{Wait: 20 * time.Second})
	g := newGate()
	h.gate.Store(g)
	defer g.Open()
	pending := h.postAsync(a, "alice", "op-1", `{"title":"slow"}`)
	handlerStarted(t, g, pending)
	waiting := h.postAsync(b, "alice", "op-1", `{"title":"slow"}`)
	letWaitersWait()
	g.Open()
	first := recv(t, pending, "the first response")
	wantFirst(t, first, "the first request")
	wantReplay(t, first, recv(t, waiting, "the waiting duplicate"), "the waiting duplicate")
	h.runs.want(t, 1, "after the duplicate")
}

// Past the stored response's retention, within the store's tombstone
// window, the key gets 410 (ProblemKeyExpired) on both nodes, whatever the
// body, and the handler does not run; after the window the key is a new
// request.
func testHTTPExpired(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{})
	wantFirst(t, h.post(a, "alice", "op-1", `{"title":"a"}`), "first request")
	window := f.window()
	if window == 0 {
		t.Skip("the engine keeps no tombstones (TombstoneWindow 0): nothing answers 410")
	}
	f.clock.Advance(retention)
	for _, srv := range []*httptest.Server{b, a} {
		for _, body := range []string{`{"title":"a"}`, `{"title":"other"}`} {
			wantProblem(t, h.post(srv, "alice", "op-1", body), http.StatusGone, receipthttp.ProblemKeyExpired, "after retention")
		}
	}
	h.runs.want(t, 1, "after retention")
	f.clock.Advance(window)
	wantFirst(t, h.post(b, "alice", "op-1", `{"title":"a"}`), "after the tombstone window")
	h.runs.want(t, 2, "after the tombstone window")
}

// Closing node A's store while its handler runs waits for the handler and
// keeps its receipt: the client gets the handler's response, Close returns
// nil, and the retry (on node B, or on node A restarted) is its replay.
func testHTTPCloseDuringHandler(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a := h.serve("a", f.db, receipthttp.Config{})
	g := newGate()
	h.gate.Store(g)
	defer g.Open()
	pending := h.postAsync(a, "alice", "op-1", `{"title":"during close"}`)
	handlerStarted(t, g, pending)
	closing := f.db
	closed := make(chan error, 1)
	go func() { closed <- closing.Close() }()
	closeBegun(t, closing)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while the handler was running", err)
	default:
	}
	g.Open()
	first := recv(t, pending, "the response")
	wantFirst(t, first, "the request Close waited for")
	require.NoError(t, recv(t, closed, "Close"))

	after := h.serve("b", f.afterClose(), receipthttp.Config{})
	wantReplay(t, first, h.post(after, "alice", "op-1", `{"title":"during close"}`), "the retry after Close")
	h.runs.want(t, 1, "after the retry")
}

// An effect the handler stages (Attempt.Stage) commits with the stored
// response, both or neither, on the engine's unit of atomic work, as both
// nodes read it:
//   - 201: the effect and the Succeeded receipt; the retry on node B is the
//     replay, and the handler ran once;
//   - 422 from the handler (a Failed receipt): the receipt, not the effect;
//   - an effect that fails after it wrote: neither (503 ProblemNotRecorded,
//     the claim abandoned), and the retry runs Recovered and commits both;
//   - a stale holder (its lease ran out and node B took the key over) that
//     answers after the takeover: its effect is not written, and the key
//     keeps the effect and the receipt of the attempt that took over.
func testHTTPEffect(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	x := newEffects(t, f)
	a, b := h.nodes(receipthttp.Config{})
	lookup := func(id string) *receipts.Receipt {
		t.Helper()
		r, err := f.b.Lookup(bg, key("alice", id))
		require.NoError(t, err)
		return r
	}

	h.effect(x, "e-ok", false)
	first := h.post(a, "alice", "op-ok", `{"title":"ok"}`, "X-Effect", "e-ok")
	wantFirst(t, first, "a request with an effect")
	require.True(t, x.has(t, "e-ok"), "the effect of a stored 201")
	require.Equal(t, receipts.Succeeded, lookup("op-ok").State)
	wantReplay(t, first, h.post(b, "alice", "op-ok", `{"title":"ok"}`, "X-Effect", "e-ok"), "the retry on node B")
	h.runs.want(t, 1, "a request and its retry")

	h.effect(x, "e-failed", false)
	failed := h.post(a, "alice", "op-failed", `{"title":"no"}`, "X-Effect", "e-failed", "X-Status", "422")
	wantStatus(t, failed, http.StatusUnprocessableEntity, "a request the handler refused")
	require.False(t, x.has(t, "e-failed"), "the effect of a response stored as Failed")
	require.Equal(t, receipts.Failed, lookup("op-failed").State)
	wantReplay(t, failed, h.post(b, "alice", "op-failed", `{"title":"no"}`), "the retry of a refused request")

	h.effect(x, "e-boom", true)
	h.effect(x, "e-boom-retry", false)
	wantProblem(t, h.post(a, "alice", "op-boom", `{"title":"boom"}`, "X-Effect", "e-boom"),
		http.StatusServiceUnavailable, receipthttp.ProblemNotRecorded, "a request whose effect failed")
	require.False(t, x.has(t, "e-boom"), "an effect that failed after it wrote")
	rec := lookup("op-boom")
	require.Equal(t, receipts.Pending, rec.State, "nothing stored for a request whose effect failed")
	require.True(t, rec.Abandoned(f.clock.Now()), "its outcome is unknown: the claim is abandoned")
	retry := h.post(b, "alice", "op-boom", `{"title":"boom"}`, "X-Effect", "e-boom-retry")
	wantFirst(t, retry, "the retry after the failed effect")
	require.Equal(t, "true", retry.header.Get("X-Recovered"), "the retry runs Recovered")
	require.True(t, x.has(t, "e-boom-retry"))
	require.False(t, x.has(t, "e-boom"))
	wantReplay(t, retry, h.post(a, "alice", "op-boom", `{"title":"boom"}`), "the replay of the retry")

	g := newGate()
	g.hold = 1 // only the first request waits
	h.gate.Store(g)
	defer g.Open()
	h.effect(x, "e-stale", false)
	h.effect(x, "e-took-over", false)
	stale := h.postAsync(a, "alice", "op-stale", `{"title":"stale"}`, "X-Effect", "e-stale")
	handlerStarted(t, g, stale)
	f.clock.Advance(leaseTTL + time.Second) // node A's lease runs out (its process stalled)
	took := h.post(b, "alice", "op-stale", `{"title":"stale"}`, "X-Effect", "e-took-over")
	wantFirst(t, took, "the retry that took the key over")
	require.Equal(t, "true", took.header.Get("X-Recovered"))
	g.Open()
	late := recv(t, stale, "the stale holder's response")
	t.Logf("the stale holder answered %d %s", late.status, bytes.TrimSpace(late.body))
	require.False(t, late.status == http.StatusCreated && !late.replayed(),
		"the stale holder answered as if it had stored its response: %d %s", late.status, late.body)
	require.False(t, x.has(t, "e-stale"), "a stale holder's effect")
	require.True(t, x.has(t, "e-took-over"), "the effect of the attempt that took over")
	wantReplay(t, took, h.post(a, "alice", "op-stale", `{"title":"stale"}`), "the key after both answered")
}

// A claim abandoned on node A (the handler answered 500) and settled by
// hand on node B, as an operator or a reconciler would (DB.TakeOver, then
// receipthttp.SettleResponse), is replayed on node A as the response it
// was settled with; the record tells that the middleware owns the key.
func testHTTPSettledByHand(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a := h.serve("a", f.db, receipthttp.Config{})
	wantStatus(t, h.post(a, "alice", "op-4", `{"title":"a"}`, "X-Status", "500"), http.StatusInternalServerError, "a handler that failed")
	r, err := f.b.Lookup(bg, key("alice", "op-4"))
	require.NoError(t, err)
	require.True(t, r.Abandoned(f.clock.Now()), "a 5xx abandons the claim")
	require.True(t, receipthttp.Owns(r), "the record of a receipthttp key")
	l, err := f.b.TakeOver(bg, r)
	require.NoError(t, err)
	_, err = receipthttp.SettleResponse(bg, l, http.StatusServiceUnavailable, nil, nil)
	require.ErrorIs(t, err, receipthttp.ErrInvalidResponse, "a 5xx is no outcome to store")
	_, err = receipthttp.SettleResponse(bg, l, http.StatusCreated,
		http.Header{"Content-Type": {"application/json"}, "Location": {"/items/7"}}, []byte(`{"id":7}`))
	require.NoError(t, err)
	got := h.post(a, "alice", "op-4", `{"title":"a"}`)
	wantStatus(t, got, http.StatusCreated, "the retry after settling")
	require.True(t, got.replayed())
	require.Equal(t, `{"id":7}`, string(got.body))
	require.Equal(t, "/items/7", got.header.Get("Location"))
	h.runs.want(t, 1, "after the retry")
}

// A handler of three steps (reserve, charge, notify) whose third step's
// reply is lost on node A (the provider performed it): the client gets 503
// ProblemNotRecorded naming the step in "step", not the handler's answer,
// and the claim is abandoned with the journal holding reserve and charge
// done and notify started. The retry on node B resumes: reserve and charge
// are not run again (their results come from the journal), notify runs
// Recovered with the same Step.ProviderKey (the provider, which
// deduplicates by it, performs it once), and the response is stored once:
// every later retry, on either node, is its replay.
func testHTTPStepsResume(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{})
	k, body := key("alice", "op-trip"), `{"title":"trip"}`
	h.steps.plan(k.ID, tripSteps, "notify")
	lost := h.post(a, k.Scope, k.ID, body)
	p := wantProblem(t, lost, http.StatusServiceUnavailable, receipthttp.ProblemNotRecorded, "a request whose step's reply was lost")
	require.Equal(t, "notify", p.Step, "the problem names the uncertain step: %s", lost.body)
	require.NotEmpty(t, lost.header.Get("Retry-After"))
	wantJournal(t, f.b, k, tripSteps, []receipts.State{receipts.Succeeded, receipts.Succeeded, receipts.Pending}, "after the lost reply")
	rec, err := f.b.Lookup(bg, k)
	require.NoError(t, err)
	require.True(t, rec.Abandoned(f.clock.Now()), "the uncertain step abandons the claim")

	h.steps.plan(k.ID, tripSteps, "") // the provider answers this time
	retry := h.post(b, k.Scope, k.ID, body)
	it := wantFirst(t, retry, "the retry on node B")
	require.Equal(t, "b", it.Node)
	require.Equal(t, "true", retry.header.Get("X-Recovered"), "the retry runs Recovered")
	require.Equal(t, []string{"reserve done", "charge done", "notify done"}, it.Steps)
	h.steps.wantResumed(t, k.ID)
	for i, srv := range []*httptest.Server{a, b} {
		wantReplay(t, retry, h.post(srv, k.Scope, k.ID, body), fmt.Sprintf("retry %d after the resumed one", i))
	}
	h.runs.want(t, 2, "a request, its resumed retry and two replays")
	h.steps.wantResumed(t, k.ID)
	wantJournal(t, f.db, k, tripSteps, []receipts.State{receipts.Succeeded, receipts.Succeeded, receipts.Succeeded}, "after the retry")
}

// A retry whose handler calls another step than the key's journal holds at
// its position (the service was changed while the request was in flight)
// gets 500 ProblemStepMismatch naming the step, on either node: no step's
// fn runs, the journal is unchanged and the claim stays abandoned. A retry
// that calls the recorded steps again resumes at the uncertain one.
func testHTTPStepMismatch(t *testing.T, f *faceEnv) {
	h := newHTTPFace(t, f)
	a, b := h.nodes(receipthttp.Config{})
	k, body := key("alice", "op-trip"), `{"title":"trip"}`
	h.steps.plan(k.ID, tripSteps, "charge")
	p := wantProblem(t, h.post(a, k.Scope, k.ID, body), http.StatusServiceUnavailable, receipthttp.ProblemNotRecorded, "a lost reply")
	require.Equal(t, "charge", p.Step)

	h.steps.plan(k.ID, []string{"reserve", "refund", "notify"}, "")
	for _, srv := range []*httptest.Server{b, a} {
		p := wantProblem(t, h.post(srv, k.Scope, k.ID, body), http.StatusInternalServerError, receipthttp.ProblemStepMismatch, "a retry that calls another step")
		require.Equal(t, "refund", p.Step, "the problem names the step that does not match")
	}
	wantMismatchChangedNothing(t, f, &h.steps, k)

	h.steps.plan(k.ID, tripSteps, "")
	it := wantFirst(t, h.post(b, k.Scope, k.ID, body), "a retry with the recorded steps")
	require.Equal(t, []string{"reserve done", "charge done", "notify done"}, it.Steps)
	charge := h.steps.stepRuns(k.ID, "charge")
	require.Len(t, charge, 2)
	require.True(t, charge[1].recovered, "the uncertain step runs Recovered")
	require.Len(t, h.steps.stepRuns(k.ID, "reserve"), 1, "a finished step never runs again")
}
