package pgstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
)

// tripCounter counts the round trips (statements and batches) sent with a counted context,
// and keeps the statements' texts.
type tripCounter struct {
	n    atomic.Int64
	mu   sync.Mutex
	sqls []string
}

type countedKey struct{}

func (c *tripCounter) ctx() context.Context { return context.WithValue(bg, countedKey{}, c) }

func (c *tripCounter) count(ctx context.Context) {
	if ctx.Value(countedKey{}) == c {
		c.n.Add(1)
	}
}

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(ctx)
	c.keep(ctx, d.SQL)
	return ctx
}

func (c *tripCounter) keep(ctx context.Context, sql string) {
	if ctx.Value(countedKey{}) == c {
		c.mu.Lock()
		c.sqls = append(c.sqls, sql)
		c.mu.Unlock()
	}
}

// sent returns the texts of the statements sent with a counted context so far, and forgets them.
func (c *tripCounter) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sqls
	c.sqls = nil
	return s
}
func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.count(ctx)
	return ctx
}
func (c *tripCounter) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.keep(ctx, d.SQL)
}
func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tripsOf returns the round trips fn sent with ctx.
func (c *tripCounter) tripsOf(fn func(ctx context.Context)) int64 {
	before := c.n.Load()
	fn(c.ctx())
	return c.n.Load() - before
}

// openCounted opens the store on a pool whose round trips c counts.
func (d *testDB) openCounted(t *testing.T, c *tripCounter) *receipts.DB {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(bg, pool, &Options{Schema: d.schema})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(); pool.Close() })
	return db
}

// The round trips of the common calls, counted as the statements and batches sent (each is one
// round trip once pgx has prepared its statements, as in steady state): a first call's
// Do is two, its claim and its commit, as the two-statement floor's; a retry is one, on the
// node that finished the operation (the replay fast path's plain read) and on one that never
// saw the key (the claim batch's fresh statement returns the finished record); a retry with
// another fingerprint is one too. DoTx's first call is two as well: the claim batch begins
// its transaction, and the receipt's write goes with its COMMIT.
func TestRoundTrips(t *testing.T) {
	d := newTestDB(t)
	var c1, c2 tripCounter
	a, b := d.openCounted(t, &c1), d.openCounted(t, &c2)
	k := receipts.Key{Scope: "trips", ID: "do"}
	do := func(db *receipts.DB, fp string) func(ctx context.Context) {
		return func(ctx context.Context) {
			r, err := db.Do(ctx, k, []byte(fp), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil })
			if fp == "other" {
				if !errors.Is(err, receipts.ErrIntentMismatch) {
					t.Fatalf("mismatch: %v %v", r, err)
				}
				return
			}
			if err != nil || r.State != receipts.Succeeded || string(r.Result) != "r" {
				t.Fatalf("do: %+v %v", r, err)
			}
		}
	}
	for _, tc := range []struct {
		what string
		c    *tripCounter
		fn   func(context.Context)
		want int64
	}{
		{"first call", &c1, do(a, "fp"), 2},
		{"retry on the node that finished it", &c1, do(a, "fp"), 1},
		{"retry on a node that never saw the key", &c2, do(b, "fp"), 1},
		{"retry with another fingerprint, on a node that never saw it", &c2, do(b, "other"), 1},
		{"retry with another fingerprint", &c1, do(a, "other"), 1},
	} {
		if got := tc.c.tripsOf(tc.fn); got != tc.want {
			t.Errorf("%s: %d round trips, want %d", tc.what, got, tc.want)
		}
	}

	kt := receipts.Key{Scope: "trips", ID: "dotx"}
	dotx := func(db *receipts.DB) func(ctx context.Context) {
		return func(ctx context.Context) {
			r, err := DoTx(ctx, db, kt, []byte("fp"), func(context.Context, pgx.Tx, *receipts.Lease) ([]byte, error) { return []byte("t"), nil })
			if err != nil || string(r.Result) != "t" {
				t.Fatalf("dotx: %+v %v", r, err)
			}
		}
	}
	c1.sent()
	if got := c1.tripsOf(dotx(a)); got != 2 {
		t.Errorf("DoTx first call: %d round trips, want 2", got)
	}
	// and its claim is the fresh insert, as Do's first call's, not the claim statement (whose
	// takeover, row lock and tombstone branches over every live partition cost the server about
	// 300 µs more per call at 64 callers: bench/README.md, "DoTx against pg-tx-floor")
	for _, sql := range c1.sent() {
		if strings.Contains(sql, "takeover AS (") {
			t.Errorf("DoTx's first call sent the claim statement:\n%s", sql)
		}
	}
	if got := c1.tripsOf(dotx(a)); got != 1 {
		t.Errorf("DoTx retry on the node that finished it: %d round trips, want 1", got)
	}
}
