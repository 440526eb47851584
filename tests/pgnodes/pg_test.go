package pgnodes

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/pgstore"
)

// newPool is the connection pool of one node process (pgOpen's).
func newPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 12 // 8 workers, renewals, the listener; 3 nodes stay far below max_connections
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pgstore.Configure(cfg) // a COMMIT made on the primary only is told (failover harness)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// poolCloser closes a pool after the DB that uses it.
type poolCloser struct{ p *pgxpool.Pool }

func (c poolCloser) Close() error { c.p.Close(); return nil }

// TestProxyPostgres: a node's pool through the proxy works, a Cut breaks its live connections,
// and the pool recovers on new ones: the node↔database cut the harness relies on.
func TestProxyPostgres(t *testing.T) {
	leakCheck(t)
	dsn, proxy := throughProxy(t, pgtest.DSN(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := newPool(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer poolCloser{pool}.Close()
	one := func() error {
		var n int
		return pool.QueryRow(ctx, "SELECT 1").Scan(&n)
	}
	if err := one(); err != nil {
		t.Fatal(err)
	}
	// Hold a connection across the cut: its next query must fail.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if proxy.Live() == 0 {
		t.Fatal("no connection goes through the proxy")
	}
	if n := proxy.Cut(); n == 0 {
		t.Fatal("Cut closed nothing")
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a query on a cut connection succeeded")
	}
	conn.Release()
	var last error
	for range 20 {
		if last = one(); last == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("the pool did not recover after the cut: %v", last)
	}
}
