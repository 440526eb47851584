package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/pgstore"
)

// These examples compile but do not run under go test (they have no Output comment): they
// need a PostgreSQL server, named here by DATABASE_URL. The package's own tests run the same
// calls on a throwaway server (internal/pgtest).

// Every node of a service opens the same database and schema, and they share one store:
// a retry on any node of an operation that ran is answered with its receipt, and fn runs
// once. ListenConn gives this node a LISTEN session, so that its waiters learn of other
// nodes' commits at once (it must not go through a transaction pooler).
func Example() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		log.Fatal(err)
	}
	pgstore.Configure(cfg) // without it, Open refuses a database with a synchronous standby
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // after db.Close: the pool is the caller's

	db, err := pgstore.Open(ctx, pool, &pgstore.Options{
		Schema:     "receipts",
		ListenConn: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	k := receipts.Key{Scope: "account-a", ID: "refund-7731"}
	fp, _ := encoding.Fingerprint(map[string]any{"amount": 1200, "currency": "EUR"})
	r, err := db.Do(ctx, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		// Call the payment provider with l.ProviderKey() as its idempotency key.
		return []byte(`{"refund":"re_123"}`), nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s attempt %d: %s\n", r.State, r.Attempts, r.Result)
}

// DoTx puts the claim, the effect and the receipt in one transaction: the rows fn writes in
// tx and the receipt commit together, or neither does. A retry of a finished operation gets
// the receipt and never calls fn.
func ExampleDoTx() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	pgstore.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db, err := pgstore.Open(ctx, pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	k := receipts.Key{Scope: "account-a", ID: "order-991"}
	fp, _ := encoding.Fingerprint(map[string]any{"sku": "A-17", "qty": 2})
	r, err := pgstore.DoTx(ctx, db, k, fp, func(ctx context.Context, tx pgx.Tx, l *receipts.Lease) ([]byte, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO orders (sku, qty) VALUES ($1, $2) RETURNING id`, "A-17", 2).Scan(&id)
		if err != nil {
			return nil, err // rolled back: nothing happened, the key is free again
		}
		return fmt.Appendf(nil, `{"order":%d}`, id), nil
	})
	if errors.Is(err, receipts.ErrInProgress) {
		log.Print("the same order is being placed right now: retry later")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", r.Result)
}

// CommitTx records a lease's receipt inside the application's own transaction: the receipt
// commits if and only if tx does. FenceTx, first in tx, makes sure nobody can take the lease
// over while tx writes the effect.
func ExampleCommitTx() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	pgstore.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db, err := pgstore.Open(ctx, pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	k := receipts.Key{Scope: "account-a", ID: "transfer-55"}
	fp, _ := encoding.Fingerprint(map[string]any{"from": "a", "to": "b", "cents": 500})
	l, r, err := db.Claim(ctx, k, fp)
	switch {
	case err != nil:
		log.Fatal(err) // receipts.ErrInProgress: another attempt holds the key
	case r != nil:
		fmt.Printf("done before: %s\n", r.Result) // a retry: the stored receipt
		return
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		_ = l.Release(ctx) // nothing happened
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // no-op once committed
	if err := pgstore.FenceTx(ctx, tx, l); err != nil {
		log.Fatal(err) // receipts.ErrLeaseLost: another attempt took the key over
	}
	if _, err := tx.Exec(ctx, `UPDATE accounts SET cents = cents - 500 WHERE id = 'a'`); err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE accounts SET cents = cents + 500 WHERE id = 'b'`); err != nil {
		log.Fatal(err)
	}
	receipt, err := pgstore.CommitTx(ctx, tx, l, []byte(`{"transfer":"ok"}`))
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err) // nothing recorded; l is still held: retry in a new transaction
	}
	fmt.Printf("%s, token %d\n", receipt.State, receipt.Token)
}
