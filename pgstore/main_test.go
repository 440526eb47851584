package pgstore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/receiptstest"
)

func TestMain(m *testing.M) {
	// The kit's Isolation/Scopes runs 100 random checks here (one rapid batch, the fewest it
	// runs), not its 300 (TestConformance), unless RECEIPTSTEST_ISOLATION_CHECKS says
	// otherwise or RECEIPTS_SOAK=1. Set here, not with t.Setenv: TestConformance is parallel.
	if !testkit.Soak() && os.Getenv("RECEIPTSTEST_ISOLATION_CHECKS") == "" {
		os.Setenv("RECEIPTSTEST_ISOLATION_CHECKS", "100")
	}
	// No goleak.VerifyTestMain: each test that checks for leaks does it itself (leakCheck),
	// so that the cluster's own helpers never count; those tests are not parallel.
	pgtest.Main(m)
}

// leakCheck fails t if goroutines started during it are still running at its end.
func leakCheck(t *testing.T) {
	t.Helper()
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
}

// newClock is the tests' fake clock, at 2026-12-03 12:00 UTC (on a
// 15-minute boundary).
func newClock() *receiptstest.Clock {
	return receiptstest.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
}

// node is one engine with its own pool: another node on the same database and schema.
type node struct {
	*engine
	pool *pgxpool.Pool
	dsn  string
}

// testDB is one fresh schema on the test server.
type testDB struct {
	t      testing.TB
	dsn    string
	schema string
	tune   func(*pgxpool.Config) // if not nil, applied to the config of every pool opened on d
}

// poolConfig is the config of a pool on d: the DSN's, with maxConns
// connections at most (if > 0), then tuned by d.tune.
func (d *testDB) poolConfig(maxConns int32) *pgxpool.Config {
	d.t.Helper()
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		d.t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if d.tune != nil {
		d.tune(cfg)
	}
	return cfg
}

func newTestDB(t *testing.T) *testDB { return newBenchDB(t) }

func newBenchDB(t testing.TB) *testDB {
	t.Helper()
	dsn, schema := pgtest.Schema(t)
	return &testDB{t: t, dsn: dsn, schema: schema}
}

// open starts an engine on the schema; o.Schema is filled in. It is closed when t ends.
func (d *testDB) open(o engineOptions) *node {
	d.t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, d.poolConfig(40))
	if err != nil {
		d.t.Fatal(err)
	}
	o.Schema = d.schema
	e, err := newEngine(ctx, pool, o)
	if err != nil {
		pool.Close()
		d.t.Fatal(err)
	}
	n := &node{engine: e, pool: pool, dsn: d.dsn}
	d.t.Cleanup(func() {
		_ = e.Close()
		pool.Close()
	})
	return n
}

// listenConn is a ListenConn for the test server.
func (d *testDB) listenConn() func(ctx context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, d.dsn) }
}

var bg = context.Background()

func key(id string) driver.Key { return driver.Key{Scope: "s", ID: id} }

func req(k driver.Key, fp string) driver.ClaimRequest {
	return driver.ClaimRequest{Key: k, Fingerprint: []byte(fp), LeaseTTL: 30 * time.Second}
}

func mustClaim(t *testing.T, e *engine, r driver.ClaimRequest, want driver.Outcome) driver.ClaimResult {
	t.Helper()
	res, err := e.Claim(bg, r)
	if err != nil {
		t.Fatalf("claim %v: %v", r.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("claim %v: outcome %v, want %v (record %+v)", r.Key, res.Outcome, want, res.Record)
	}
	return res
}
