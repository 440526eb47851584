package receiptstest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// Nodes is a capability a Store may have: several processes open one store
// at once, as the nodes (replicas) of a service do. PostgreSQL has it (each
// node runs pgstore.Open on the same schema with a pool of its own); an
// embedded Pebble store does not (one process holds its directory).
//
// The front-end suites (RunHTTP, RunMCP) serve each test from two nodes:
// two servers, each with its own middleware, on two handles of one store
// when the Store implements Nodes, or else on the one *receipts.DB (two
// servers in one process). A retry that lands on the other node is then
// answered from the store as every node sees it.
type Nodes interface {
	// OpenNode opens another handle on the store db lives in, with opts,
	// as another node of the service would, and arranges for it to be
	// closed when t ends. db was returned by the Store's Open or Reopen
	// and is still open.
	OpenNode(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error)
}

// A test of a front-end suite.
type faceTest struct {
	name string
	fn   func(t *testing.T, f *faceEnv)
}

// runFaces runs tests against s, each with its own store and two nodes.
func runFaces(t *testing.T, s Store, tests []faceTest) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newFaceEnv(t, s)) })
	}
}

// faceEnv is one store served by two nodes.
type faceEnv struct {
	*env
	b     *receipts.DB // the other node's handle: e.db itself if !nodes
	nodes bool         // b is a handle of its own (the Store implements Nodes)
}

// newFaceEnv opens a store with the kit's options and a second node on it.
func newFaceEnv(t *testing.T, s Store) *faceEnv {
	t.Helper()
	f := &faceEnv{env: newEnv(t, s, nil)}
	f.b = f.db
	if n, ok := s.(Nodes); ok {
		b, err := n.OpenNode(t, f.db, f.opts)
		require.NoError(t, err, "Nodes.OpenNode")
		require.NotNil(t, b, "Nodes.OpenNode")
		f.b, f.nodes = b, true
	}
	return f
}

// afterClose returns a handle on the store once node A's handle is closed:
// node B's, or, on a store that only one process opens, the store
// reopened (a restart of the one node).
func (f *faceEnv) afterClose() *receipts.DB {
	f.t.Helper()
	if f.nodes {
		return f.b
	}
	f.reopen()
	return f.db
}

// closeBegun waits until db refuses new calls: its Close has begun.
func closeBegun(t testing.TB, db *receipts.DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := db.Lookup(bg, key("probe", "probe"))
		return errors.Is(err, receipts.ErrClosed)
	}, 30*time.Second, time.Millisecond, "Close never began")
}

// gate holds the handlers that pass through it until it is opened, and
// reports each one that arrives.
type gate struct {
	hold    int64 // if > 0, only the first hold arrivals wait
	n       atomic.Int64
	once    sync.Once
	open    chan struct{}
	arrived chan struct{}
}

func newGate() *gate {
	return &gate{open: make(chan struct{}), arrived: make(chan struct{}, 64)}
}

// pass is called by a handler: it reports its arrival and waits for Open.
// A nil gate lets every handler through.
func (g *gate) pass() {
	if g == nil || (g.hold > 0 && g.n.Add(1) > g.hold) {
		return
	}
	g.arrived <- struct{}{}
	<-g.open
}

// Open lets every handler through, now and from now on.
func (g *gate) Open() { g.once.Do(func() { close(g.open) }) }

// runs counts a handler's executions.
type runs struct{ n atomic.Int64 }

func (r *runs) add() int64  { return r.n.Add(1) }
func (r *runs) load() int64 { return r.n.Load() }
func (r *runs) want(t testing.TB, n int64, what string) {
	t.Helper()
	require.Equal(t, n, r.load(), "%s: the handler ran %d times", what, r.load())
}
