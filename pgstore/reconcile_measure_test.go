package pgstore

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/tests/measure"
)

// TestMeasureReconcile is the root package's TestMeasureReconcile on PostgreSQL: a
// Reconciler pass over many abandoned claims, its time and the checks it made
// (tests/measure). It runs only with RECEIPTS_MEASURE=1 (RECEIPTS_MEASURE_N claims,
// default 10000):
//
//	RECEIPTS_MEASURE=1 go test -run TestMeasureReconcile -v ./pgstore
func TestMeasureReconcile(t *testing.T) {
	n := measure.Size(t, 10000)
	dsn, schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db, err := Open(context.Background(), pool, &Options{Options: receipts.Options{GCInterval: -1}, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	measure.Reconcile(t, db, n, 32, []measure.Pass{{Concurrency: 16}})
}
