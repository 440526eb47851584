package receiptmcp_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptmcp"
	"github.com/receiptstore/receipts/receiptstest"
)

// slowServer is a store on a file system that outlives it, and a server
// whose "work" tool takes 100ms by the store's clock and, for a call with
// {"slow": true}, waits for gate first.
type slowServer struct {
	t    *testing.T
	fs   vfs.FS
	clk  *receiptstest.Clock
	db   *receipts.DB
	gate chan struct{}
	open sync.Once // closes gate
	runs atomic.Int64
}

func (s *slowServer) release() { s.open.Do(func() { close(s.gate) }) }

func newSlowServer(t *testing.T) *slowServer {
	s := &slowServer{t: t, fs: vfs.NewMem(), clk: receiptstest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), gate: make(chan struct{})}
	s.openDB()
	t.Cleanup(func() {
		s.release()
		if err := s.db.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func (s *slowServer) openDB() {
	db, err := pebblestore.Open("/db", &pebblestore.Options{
		Options: receipts.Options{
			Now:        s.clk.Now,
			LeaseTTL:   leaseTTL,
			GCInterval: -1,
			Logger:     quiet,
		},
		Pebble: &pebble.Options{FS: s.fs},
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.db = db
}

// connect serves a fresh server with the middleware on s.db and connects
// a client to it.
func (s *slowServer) connect(wait time.Duration) *mcp.ClientSession {
	t := s.t
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, &mcp.ServerOptions{Logger: quiet})
	type in struct {
		Slow bool `json:"slow,omitempty"`
		N    int  `json:"n,omitempty"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "work"}, func(ctx context.Context, req *mcp.CallToolRequest, in in) (*mcp.CallToolResult, any, error) {
		n := s.runs.Add(1)
		if in.Slow {
			<-s.gate
		}
		s.clk.Advance(100 * time.Millisecond)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint("run ", n)}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "export"}, func(ctx context.Context, req *mcp.CallToolRequest, in in) (*mcp.CallToolResult, any, error) {
		n := s.runs.Add(1)
		if in.Slow {
			<-s.gate
		}
		s.clk.Advance(1500 * time.Millisecond) // a tool 15 times slower than work
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint("export ", n)}}}, nil, nil
	})
	srv.AddReceivingMiddleware(receiptmcp.Middleware(s.db, receiptmcp.Config{FixedScope: "local", Wait: wait, Logger: quiet}))
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil)
	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
	cs, err := client.Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.release() // a test that failed early must not leave the tool blocked
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// claimed waits until key is claimed in s.db.
func (s *slowServer) claimed(key string) {
	deadline := time.Now().Add(testTimeout)
	for {
		if _, err := s.db.Lookup(context.Background(), receipts.Key{Scope: "local", ID: key}); err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s never claimed", key)
		}
		time.Sleep(time.Millisecond)
	}
}

func text(res *mcp.CallToolResult) string {
	if res == nil || len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

// TestCloseWaitsForToolCall: db.Close during an in-flight tool call waits
// for it and for its result to be recorded; after a restart the retry gets
// the stored result.
func TestCloseWaitsForToolCall(t *testing.T) {
	s := newSlowServer(t)
	cs := s.connect(-1)
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"slow": true}
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := call(context.Background(), cs, key, "work", args)
		done <- answer{res, err}
	}()
	s.claimed(key)

	closed := make(chan error, 1)
	db := s.db
	go func() { closed <- db.Close() }()
	deadline := time.Now().Add(testTimeout)
	for { // until Close has begun
		if _, err := db.Lookup(context.Background(), receipts.Key{Scope: "probe", ID: "probe"}); errors.Is(err, receipts.ErrClosed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Close did not begin")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a tool call was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	s.release()
	first := recv(t, done)
	if first.err != nil || first.res.IsError {
		t.Fatalf("the call in flight during Close: %+v, %v", first.res, first.err)
	}
	if err := recv(t, closed); err != nil {
		t.Fatal(err)
	}

	s.openDB()
	again, err := call(context.Background(), s.connect(-1), key, "work", args)
	if err != nil {
		t.Fatalf("retry after restart: %v", err)
	}
	if !isReplay(again) || text(again) != text(first.res) {
		t.Fatalf("retry after restart: %q (replay %v), want the replay of %q", text(again), isReplay(again), text(first.res))
	}
	if s.runs.Load() != 1 {
		t.Fatalf("tool ran %d times, want 1", s.runs.Load())
	}
}

// TestRetryAfterMsFollowsCallTimes: after a few calls that took 100ms, a
// duplicate of one in progress is told to retry within about 100ms, not
// after the lease's 30s.
func TestRetryAfterMsFollowsCallTimes(t *testing.T) {
	s := newSlowServer(t)
	cs := s.connect(-1)
	for i := range 5 {
		mustCall(t, cs, receiptmcp.NewOperationKey(), "work", map[string]any{"n": i})
	}
	key := receiptmcp.NewOperationKey()
	args := map[string]any{"slow": true}
	done := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), cs, key, "work", args)
		done <- err
	}()
	s.claimed(key)
	_, err := call(context.Background(), cs, key, "work", args)
	data := wantError(t, err, receiptmcp.CodeInProgress, receiptmcp.TypeInProgress)
	s.release()
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	if ms := data.RetryAfterMs; ms < 1 || ms > 100 {
		t.Fatalf("retryAfterMs = %d, want 1..100 (calls take 100ms; the lease is %s)", ms, leaseTTL)
	}
}

// TestRetryAfterMsPerTool: a 1.5 s tool measured among many 100 ms calls of
// another. A duplicate of the slow tool's call is told about 1.5 s, not the
// store's average that the fast tool dominates (about 0.2 s here: what every
// tool's duplicates were told before estimates were kept per tool).
func TestRetryAfterMsPerTool(t *testing.T) {
	s := newSlowServer(t)
	cs := s.connect(-1)
	mustCall(t, cs, receiptmcp.NewOperationKey(), "export", map[string]any{"n": 0})
	for i := range 20 {
		mustCall(t, cs, receiptmcp.NewOperationKey(), "work", map[string]any{"n": i})
	}
	inProgress := func(tool string) int64 {
		t.Helper()
		key := receiptmcp.NewOperationKey()
		args := map[string]any{"slow": true}
		done := make(chan error, 1)
		go func() {
			_, err := call(context.Background(), cs, key, tool, args)
			done <- err
		}()
		s.claimed(key)
		_, err := call(context.Background(), cs, key, tool, args)
		data := wantError(t, err, receiptmcp.CodeInProgress, receiptmcp.TypeInProgress)
		s.release()
		if err := recv(t, done); err != nil {
			t.Fatal(err)
		}
		s.open, s.gate = sync.Once{}, make(chan struct{}) // a new gate for the next call
		return data.RetryAfterMs
	}
	if ms := inProgress("export"); ms < 1400 || ms > 1500 {
		t.Fatalf("export: retryAfterMs = %d, want about 1500 (its one call took 1.5 s)", ms)
	}
	if ms := inProgress("work"); ms < 90 || ms > 100 {
		t.Fatalf("work: retryAfterMs = %d, want about 100", ms)
	}
}
