package receipts_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
)

// TestMeasureReconcile measures, for the record, one Reconciler pass over
// many abandoned claims on a store on disk: its time and the checks it
// made. It runs only with RECEIPTS_MEASURE=1 (RECEIPTS_MEASURE_N claims,
// default 10000):
//
//	RECEIPTS_MEASURE=1 go test -run TestMeasureReconcile -v .
func TestMeasureReconcile(t *testing.T) {
	if os.Getenv("RECEIPTS_MEASURE") == "" {
		t.Skip("RECEIPTS_MEASURE=1 runs it")
	}
	n := 10000
	if s := os.Getenv("RECEIPTS_MEASURE_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	start := time.Now()
	var wg sync.WaitGroup
	const workers = 64
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

	for _, conc := range []int{1, 16} {
		var checks atomic.Int64
		rc, err := db.NewReconciler(receipts.ReconcilerOptions{
			Interval:    -1,
			Concurrency: conc,
			Check: func(ctx context.Context, l *receipts.Lease, r *receipts.Receipt) ([]byte, error) {
				checks.Add(1)
				if conc == 1 {
					return nil, fmt.Errorf("provider: unknown") // abandoned again: the next pass has them all
				}
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
