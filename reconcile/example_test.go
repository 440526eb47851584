package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/reconcile"
)

// A payment whose outcome is unknown (the service crashed after calling the
// provider) is settled by a Reconciler, which asks the provider by
// ProviderKey, before the client retries; the retry then gets the receipt
// and charges nothing.
func Example() {
	dir, _ := os.MkdirTemp("", "receipts-example")
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()

	charged := map[string]string{} // the provider: charges by idempotency key
	k := receipts.Key{Scope: "acct-7", ID: "pay-invoice-42"}
	l, _, err := db.Claim(ctx, k, []byte("fp"))
	if err != nil {
		panic(err)
	}
	charged[l.ProviderKey()] = `{"charge":"ch_1"}` // the charge went through...
	_ = l.Abandon(ctx)                             // ...and the response was lost

	rc, err := reconcile.New(db, reconcile.Options{
		Interval: -1, // no background passes: this example calls Run
		Check: func(ctx context.Context, l *receipts.Lease, r *receipts.Receipt) ([]byte, error) {
			if c, ok := charged[l.ProviderKey()]; ok {
				return []byte(c), nil // it happened: commit its result
			}
			return nil, receipts.NotPerformed(errors.New("no charge")) // the key is free again
		},
		OnSettle: func(s reconcile.Settlement) {
			fmt.Printf("%s: %s (attempt %d)\n", s.Key.ID, s.Outcome, s.Attempt)
		},
	})
	if err != nil {
		panic(err)
	}
	defer rc.Close()
	st, err := rc.Run(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("checked:", st.Checked, "committed:", st.Committed)

	r, err := db.Do(ctx, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, errors.New("must not charge twice")
	}, receipts.LeaseFor(time.Minute))
	fmt.Println("client retry:", string(r.Result), err)
	// Output:
	// pay-invoice-42: committed (attempt 2)
	// checked: 1 committed: 1
	// client retry: {"charge":"ch_1"} <nil>
}
