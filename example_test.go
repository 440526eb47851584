package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
)

// A tool call whose response is lost is retried with the same operation
// key: the effect runs once, and the retry gets the stored result.
func ExampleDB_Do() {
	dir, _ := os.MkdirTemp("", "receipts-example")
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	ctx := context.Background()
	k := receipts.Key{Scope: "account-a", ID: "approved-action-17"}
	fp, _ := encoding.Fingerprint(map[string]any{"title": "Review evals"})
	effects := 0
	createItem := func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		effects++
		return []byte(`{"item":1}`), nil
	}

	first, _ := db.Do(ctx, k, fp, createItem)
	retry, _ := db.Do(ctx, k, fp, createItem) // the first response was lost

	other, _ := encoding.Fingerprint(map[string]any{"title": "Different work"})
	_, err = db.Do(ctx, k, other, createItem)

	fmt.Println(string(first.Result), string(retry.Result), "effects:", effects)
	fmt.Println(errors.Is(err, receipts.ErrIntentMismatch))
	// Output:
	// {"item":1} {"item":1} effects: 1
	// true
}

// Claim and Commit give full control: forward the provider key, commit the
// provider's answer, and reconcile a takeover whose outcome is unknown.
func ExampleDB_Claim() {
	dir, _ := os.MkdirTemp("", "receipts-example")
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	ctx := context.Background()
	k := receipts.Key{Scope: "account-a", ID: "refund-42"}
	fp, _ := encoding.Fingerprint(map[string]any{"amount": 1200, "currency": "EUR"})

	lease, receipt, err := db.Claim(ctx, k, fp)
	switch {
	case err != nil:
		panic(err)
	case receipt != nil:
		fmt.Println("already done:", string(receipt.Result))
		return
	}
	if lease.Recovered() {
		// A previous attempt may have reached the provider: look it up
		// by lease.ProviderKey() before acting again.
	}
	// Send the refund with Idempotency-Key: lease.ProviderKey() ...
	r, err := lease.Commit(ctx, []byte("refund re_123 created"))
	if err != nil {
		panic(err)
	}
	fmt.Println(r.State, string(r.Result))

	_, again, _ := db.Claim(ctx, k, fp)
	fmt.Println("retry:", again.State, string(again.Result))
	// Output:
	// succeeded refund re_123 created
	// retry: succeeded refund re_123 created
}

// Stats is cheap (settings, gauges, counters); Count reads every record to
// count them by state; Check reads every record to verify the store.
func ExampleDB_Check() {
	dir, _ := os.MkdirTemp("", "receipts-example")
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	for _, id := range []string{"op-1", "op-2"} {
		_, _ = db.Do(ctx, receipts.Key{Scope: "acct", ID: id}, []byte("fp"),
			func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("done"), nil })
	}
	_, _, _ = db.Claim(ctx, receipts.Key{Scope: "acct", ID: "op-3"}, []byte("fp"))

	fmt.Println("commits:", db.Stats().Commits)
	c, err := db.Count(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("succeeded:", c.Succeeded, "pending:", c.Pending)
	rep, err := db.Check(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("records:", rep.Records, "ok:", rep.OK())
	for _, p := range rep.Problems {
		fmt.Println(p.Key, p.Epoch, p.What)
	}
	// Output:
	// commits: 2
	// succeeded: 2 pending: 1
	// records: 3 ok: true
}
