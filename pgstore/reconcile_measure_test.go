package pgstore

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// TestMeasureReconcile is the root package's TestMeasureReconcile on PostgreSQL: one
// Reconciler pass over many abandoned claims, its time and the checks it made. It runs only
// with RECEIPTS_MEASURE=1 (RECEIPTS_MEASURE_N claims, default 10000).
func TestMeasureReconcile(t *testing.T) {
	if os.Getenv("RECEIPTS_MEASURE") == "" {
		t.Skip("RECEIPTS_MEASURE=1 runs it")
	}
	n := 10000
	if s := os.Getenv("RECEIPTS_MEASURE_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
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
	ctx := context.Background()
	db, err := Open(ctx, pool, &Options{Options: receipts.Options{GCInterval: -1}, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	start := time.Now()
	var wg sync.WaitGroup
	const workers = 32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				l, _, err := db.Claim(ctx, receipts.Key{Scope: "s", ID: fmt.Sprint("op-", i)}, []byte("fp"))
				if err == nil {
					err = l.Abandon(ctx)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("setup: %d abandoned claims in %s", n, time.Since(start).Round(time.Millisecond))

	for _, conc := range []int{16} {
		var checks atomic.Int64
		rc, err := db.NewReconciler(receipts.ReconcilerOptions{
			Interval:    -1,
			Concurrency: conc,
			Check: func(ctx context.Context, l *receipts.Lease, r *receipts.Receipt) ([]byte, error) {
				checks.Add(1)
				return []byte("ok"), nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		st, err := rc.Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("pass, concurrency %2d: %d listed, %d checks (%d provider calls), committed %d, unknown %d, skipped %d, errors %d, in %s (%.0f claims/s)",
			conc, st.Listed, st.Checked, checks.Load(), st.Committed, st.Unknown, st.Skipped, st.Errors,
			st.Duration.Round(time.Millisecond), float64(st.Checked)/st.Duration.Seconds())
		if err := rc.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
