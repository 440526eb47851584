// Package measure holds the measurements that the engines' packages run
// for the record (never pass/fail on a timing), written once for every
// engine. They run only with RECEIPTS_MEASURE=1.
package measure

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
	"github.com/receiptstore/receipts/reconcile"
)

// Size is the number of items a measurement uses: RECEIPTS_MEASURE_N, or
// def. It skips t unless RECEIPTS_MEASURE is set.
func Size(t testing.TB, def int) int {
	t.Helper()
	if os.Getenv("RECEIPTS_MEASURE") == "" {
		t.Skip("RECEIPTS_MEASURE=1 runs it")
	}
	if s := os.Getenv("RECEIPTS_MEASURE_N"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("RECEIPTS_MEASURE_N=%q: want a positive number", s)
		}
		return n
	}
	return def
}

// Reconcile makes n abandoned claims on db (with workers concurrent
// callers), then runs one Reconciler pass per entry of concs with that
// concurrency, and logs each pass: what it listed, the provider checks it
// made, what it settled, and its time. A pass whose check answers
// "unknown" (unknown true) abandons every claim again, so the next pass
// has them all; otherwise its checks commit them.
func Reconcile(t testing.TB, db *receipts.DB, n, workers int, passes []Pass) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
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

	for _, p := range passes {
		var checks atomic.Int64
		rc, err := reconcile.New(db, reconcile.Options{
			Interval:    -1,
			Concurrency: p.Concurrency,
			Check: func(ctx context.Context, l *receipts.Lease, r *receipts.Receipt) ([]byte, error) {
				checks.Add(1)
				if p.Unknown {
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
			p.Concurrency, st.Listed, st.Checked, checks.Load(), st.Committed, st.Unknown, st.Skipped, st.Errors,
			st.Duration.Round(time.Millisecond), float64(st.Checked)/st.Duration.Seconds())
		if err := rc.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Pass is one Reconciler pass of Reconcile: its concurrency, and whether
// its provider check answers "unknown" (the claims stay abandoned).
type Pass struct {
	Concurrency int
	Unknown     bool
}
