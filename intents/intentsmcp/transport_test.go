package intentsmcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentsmcp"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptmcp"
	"github.com/receiptstore/receipts/receiptstest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type chargeIn struct {
	Intent string `json:"intent"`
	Amount int    `json:"amount"`
}

type chargeOut struct {
	Charge string `json:"charge"`
}

// service is a real receiptmcp server on a receipts store, served over
// streamable HTTP on 127.0.0.1. Its effects are counted by intent.
type service struct {
	t     *testing.T
	db    *receipts.DB
	clock *receiptstest.Clock
	srv   *httptest.Server
	h     atomic.Pointer[http.Handler] // swapped to "restart" the MCP server
	// servers are the MCP servers made so far; cleanup closes their
	// sessions (a restart leaves the old ones open, as a dead process's
	// would be, for the client's next call to find gone).
	servers []*mcp.Server

	mu      sync.Mutex
	effects map[string]int
	keys    map[string]map[string]bool
	dropped map[string]bool

	dropFirst atomic.Bool   // lose the first response of each intent, after it is recorded
	stripMeta atomic.Bool   // drop results' _meta, as some client frameworks do
	slow      chan struct{} // when set, charges wait on it
}

func newService(t *testing.T) *service {
	t.Helper()
	s := &service{t: t, clock: receiptstest.NewClock(time.Now()), effects: map[string]int{},
		keys: map[string]map[string]bool{}, dropped: map[string]bool{}}
	db, err := pebblestore.Open("svc", &pebblestore.Options{
		Options: receipts.Options{
			Now:        s.clock.Now,
			Retention:  time.Hour,
			LeaseTTL:   2 * time.Second,
			GCInterval: -1,
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.db = db
	s.restart()
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := *s.h.Load()
		if r.Method != http.MethodPost || !s.dropFirst.Load() {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Arguments chargeIn `json:"arguments"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		intent := msg.Params.Arguments.Intent
		s.mu.Lock()
		drop := msg.Method == "tools/call" && !s.dropped[intent]
		if drop {
			s.dropped[intent] = true
		}
		s.mu.Unlock()
		if drop {
			h.ServeHTTP(&discard{h: http.Header{}}, r)
			panic(http.ErrAbortHandler) // the response is lost
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		for _, server := range s.servers {
			for ss := range server.Sessions() {
				_ = ss.Close()
			}
		}
		s.srv.Close()
		if err := s.db.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// restart replaces the MCP server (and its sessions) by a new one on the
// same store, as a restarted process would.
func (s *service) restart() {
	server := mcp.NewServer(&mcp.Implementation{Name: "billing"}, nil)
	s.servers = append(s.servers, server)
	mcp.AddTool(server, &mcp.Tool{Name: "charge"}, s.charge)
	server.AddReceivingMiddleware(s.strip, s.logKeys, receiptmcp.Middleware(s.db, receiptmcp.Config{FixedScope: "host-1", Wait: -1}))
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{JSONResponse: true})
	s.h.Store(&h)
}

// strip drops the _meta of tool results when stripMeta is set.
func (s *service) strip(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*mcp.CallToolResult); ok && s.stripMeta.Load() {
			r.Meta = nil
		}
		return res, err
	}
}

// logKeys records the key each tools/call arrives with.
func (s *service) logKeys(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if call, ok := req.(*mcp.CallToolRequest); ok {
			var in chargeIn
			_ = json.Unmarshal(call.Params.Arguments, &in)
			key, _ := call.Params.Meta[receiptmcp.DefaultMetaKey].(string)
			s.mu.Lock()
			if s.keys[in.Intent] == nil {
				s.keys[in.Intent] = map[string]bool{}
			}
			s.keys[in.Intent][key] = true
			s.mu.Unlock()
		}
		return next(ctx, method, req)
	}
}

func (s *service) charge(_ context.Context, _ *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, chargeOut, error) {
	if in.Amount <= 0 {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "amount must be positive"}}}, chargeOut{}, nil
	}
	if ch := s.slow; ch != nil {
		<-ch
	}
	s.mu.Lock()
	s.effects[in.Intent]++
	n := s.effects[in.Intent]
	s.mu.Unlock()
	return nil, chargeOut{Charge: fmt.Sprintf("ch_%s_%d", in.Intent, n)}, nil
}

func (s *service) count(intent string) (effects, keys int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[intent], len(s.keys[intent])
}

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Flush()                      {}

// host is a journal and a Dispatcher delivering to svc over MCP.
type host struct {
	t  *testing.T
	j  *intents.Journal
	d  *intents.Dispatcher
	tr *intentsmcp.Transport
}

func newHost(t *testing.T, svc *service, o intents.DispatcherOptions) *host {
	t.Helper()
	j, err := intents.Open("host", &intents.Options{Pebble: &pebble.Options{FS: vfs.NewMem()}, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "host"}, nil)
	tr := intentsmcp.New(func(ctx context.Context) (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: svc.srv.URL, MaxRetries: -1}, nil)
	}, nil)
	h := &host{t: t, j: j, tr: tr}
	t.Cleanup(func() {
		if h.d != nil {
			_ = h.d.Close()
		}
		_ = tr.Close()
		_ = j.Close()
	})
	return h
}

func (h *host) start(o intents.DispatcherOptions) {
	h.t.Helper()
	o.Transports = map[string]intents.Transport{"billing": h.tr}
	o.MinBackoff, o.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	d, err := intents.NewDispatcher(h.j, o)
	if err != nil {
		h.t.Fatal(err)
	}
	h.d = d
}

func (h *host) approve(intent string, amount int) *intents.Action {
	h.t.Helper()
	a, err := h.j.Approve(context.Background(), intents.Approval{Target: "billing", Operation: "charge",
		Arguments: chargeIn{Intent: intent, Amount: amount}, ApprovedBy: "alice", Deadline: time.Now().Add(20 * time.Second)})
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

func (h *host) wait(key string) *intents.Action {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := h.j.Wait(ctx, key)
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

func structured(t *testing.T, a *intents.Action) string {
	t.Helper()
	var res struct {
		StructuredContent chargeOut `json:"structuredContent"`
	}
	if err := json.Unmarshal(a.Answer.Body, &res); err != nil {
		t.Fatalf("answer body %s: %v", a.Answer.Body, err)
	}
	return res.StructuredContent.Charge
}

func TestDeliversOnce(t *testing.T) {
	svc := newService(t)
	h := newHost(t, svc, intents.DispatcherOptions{})
	h.start(intents.DispatcherOptions{})
	a := h.approve("i1", 100)
	b := h.approve("i1b", 100)
	for _, x := range []*intents.Action{a, b} {
		if got := h.wait(x.Key); got.State != intents.Succeeded || got.Answer.Replayed {
			t.Fatalf("%+v", got.Answer)
		}
	}
	if got := structured(t, h.wait(a.Key)); got != "ch_i1_1" {
		t.Fatalf("charge %q", got)
	}
	for _, i := range []string{"i1", "i1b"} {
		if e, k := svc.count(i); e != 1 || k != 1 {
			t.Fatalf("%s: %d effects under %d keys", i, e, k)
		}
	}
}

func TestLostResponseAndServerRestart(t *testing.T) {
	svc := newService(t)
	svc.dropFirst.Store(true)
	h := newHost(t, svc, intents.DispatcherOptions{})
	h.start(intents.DispatcherOptions{})
	a := h.approve("i2", 5)
	got := h.wait(a.Key)
	if got.State != intents.Succeeded || structured(t, got) != "ch_i2_1" || !got.Answer.Replayed {
		t.Fatalf("after a lost response: %+v %s", got.Answer, got.Answer.Body)
	}
	// A restarted server knows no session: the transport connects again.
	svc.dropFirst.Store(false)
	svc.restart()
	b := h.approve("i3", 6)
	if got := h.wait(b.Key); got.State != intents.Succeeded {
		t.Fatalf("after a server restart: %+v", got)
	}
	for _, i := range []string{"i2", "i3"} {
		if e, k := svc.count(i); e != 1 || k != 1 {
			t.Fatalf("%s: %d effects under %d keys", i, e, k)
		}
	}
}

func TestInProgress(t *testing.T) {
	svc := newService(t)
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	t.Cleanup(done) // before the service's cleanup, which waits for the call
	svc.slow = release
	h := newHost(t, svc, intents.DispatcherOptions{})
	h.start(intents.DispatcherOptions{AttemptTimeout: 100 * time.Millisecond})
	a := h.approve("i4", 5)
	deadline := time.Now().Add(10 * time.Second)
	for {
		cur, err := h.j.Get(context.Background(), a.Key)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(cur.LastError, receiptmcp.TypeInProgress) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never in progress: %+v", cur)
		}
		time.Sleep(10 * time.Millisecond)
	}
	done()
	if got := h.wait(a.Key); got.State != intents.Succeeded {
		t.Fatalf("%+v", got)
	}
	if e, k := svc.count("i4"); e != 1 || k != 1 {
		t.Fatalf("%d effects under %d keys", e, k)
	}
}

func TestDefinitiveAnswers(t *testing.T) {
	svc := newService(t)
	h := newHost(t, svc, intents.DispatcherOptions{})
	ctx := context.Background()
	failed := h.approve("bad", 0) // isError: stored, replayed
	unknown, err := h.j.Approve(ctx, intents.Approval{Target: "billing", Operation: "no_such_tool", ApprovedBy: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	// An earlier process of the host sent these keys.
	expired := h.approve("e1", 7)
	call(t, svc, expired.Key, chargeIn{"e1", 7})
	svc.clock.Advance(2 * time.Hour)
	conflict := h.approve("c1", 5)
	call(t, svc, conflict.Key, chargeIn{"c1", 6})

	h.start(intents.DispatcherOptions{})
	for _, c := range []struct {
		a     *intents.Action
		state intents.State
		code  string
	}{
		{failed, intents.Failed, ""},
		{unknown, intents.Failed, "jsonrpc/-32602"},
		{conflict, intents.Conflict, receiptmcp.TypeKeyConflict},
		{expired, intents.Expired, receiptmcp.TypeKeyExpired},
	} {
		got := h.wait(c.a.Key)
		if got.State != c.state || got.Answer.Code != c.code {
			t.Errorf("%s %s: %v %q (%s), want %v %q", c.a.Key, c.a.Operation, got.State, got.Answer.Code, got.Answer.Body, c.state, c.code)
		}
	}
}

// call makes one tools/call of charge under key, on a session of its own.
func call(t *testing.T, svc *service, key string, in chargeIn) {
	t.Helper()
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "earlier"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: svc.srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: in, Meta: mcp.Meta{receiptmcp.DefaultMetaKey: key}})
	if err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
}

// TestReplayMarkDropped: with the results' _meta dropped on the way (as
// some client frameworks do), a lost response is still fetched again and
// recorded once; only Answer.Replayed, for people, is lost.
func TestReplayMarkDropped(t *testing.T) {
	svc := newService(t)
	svc.dropFirst.Store(true)
	svc.stripMeta.Store(true)
	h := newHost(t, svc, intents.DispatcherOptions{})
	h.start(intents.DispatcherOptions{})
	a := h.approve("i9", 5)
	got := h.wait(a.Key)
	if got.State != intents.Succeeded || structured(t, got) != "ch_i9_1" || got.Answer.Replayed {
		t.Fatalf("%+v %s", got.Answer, got.Answer.Body)
	}
	if e, k := svc.count("i9"); e != 1 || k != 1 {
		t.Fatalf("%d effects under %d keys", e, k)
	}
}
