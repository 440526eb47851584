package pgstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
)

// pgstore on pools that do not use pgx's statement cache: behind PgBouncer in transaction
// mode (before 1.21, or without max_prepared_statements) a pool must use the simple protocol
// or unnamed statements, and some services pick describe modes. The contract's round trip,
// concurrent Do on two nodes, and DoTx's outcomes (its savepoint's rollback in an aborted
// transaction among them) hold in each mode. The other tests run the default mode.
func TestQueryExecModes(t *testing.T) {
	t.Parallel() // schemas of its own, no leak check
	for _, m := range []pgx.QueryExecMode{
		pgx.QueryExecModeSimpleProtocol,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
	} {
		t.Run(m.String(), func(t *testing.T) {
			tuned := func() *testDB {
				d := newTestDB(t)
				d.tune = func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = m }
				return d
			}
			t.Run("Open", func(t *testing.T) { testOpenServesTheContract(t, tuned()) })
			t.Run("Do", func(t *testing.T) { testDoOnceAcrossNodes(t, tuned()) })
			t.Run("DoTx", func(t *testing.T) { testDoTxOnceAcrossNodes(t, tuned()) })
			t.Run("DoTxOutcomes", func(t *testing.T) { testDoTxOutcomes(t, tuned()) })
		})
	}
}

// testDoOnceAcrossNodes: callers of a few keys on two nodes, all at once; each key's fn runs
// once and every caller of it gets its one result.
func testDoOnceAcrossNodes(t *testing.T, d *testDB) {
	a, _ := d.openDB(Options{})
	b, _ := d.openDB(Options{})
	const keys, callers = 6, 48
	var calls [keys]atomic.Int32
	results := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		db := a
		if i%2 == 1 {
			db = b
		}
		k := i % keys
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := db.Do(bg, receipts.Key{Scope: "s", ID: fmt.Sprint(k)}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
				calls[k].Add(1)
				return fmt.Appendf(nil, "r%d", k), nil
			})
			errs[i] = err
			if r != nil {
				results[i] = string(r.Result)
			}
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || results[i] != fmt.Sprintf("r%d", i%keys) {
			t.Errorf("caller %d: %q %v", i, results[i], errs[i])
		}
	}
	for k := range calls {
		if n := calls[k].Load(); n != 1 {
			t.Errorf("key %d: fn ran %d times", k, n)
		}
	}
	if s := a.Stats().Commits + b.Stats().Commits; s != keys {
		t.Errorf("%d commits, want %d", s, keys)
	}
}
