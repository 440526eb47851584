package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/receiptstore/receipts"
)

// A front end that answers "in progress" itself claims the key with Claim,
// then runs the effect under the lease with Run, which renews the lease and
// records the outcome as Do would (Close waits for it). Here the provider
// times out: the outcome is unknown, so the claim is abandoned and the
// retry reconciles.
func ExampleLease_Run() {
	dir, _ := os.MkdirTemp("", "receipts-example")
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	ctx := context.Background()
	k := receipts.Key{Scope: "account-a", ID: "charge-42"}
	fp := []byte("charge 42 EUR")
	charge := func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		if !l.Recovered() {
			return nil, errors.New("provider timed out") // did it charge?
		}
		// Reconcile: look the charge up by l.ProviderKey() first.
		return []byte(`{"charge":"ch_1"}`), nil
	}
	for range 2 {
		l, r, err := db.Claim(ctx, k, fp)
		if err != nil || r != nil {
			fmt.Println("answered without running:", r, err)
			continue
		}
		r, err = l.Run(ctx, charge)
		switch {
		case errors.Is(err, receipts.ErrOutcomeUnknown):
			fmt.Println("outcome unknown; retry with the same key")
		case err != nil:
			fmt.Println("error:", err)
		default:
			fmt.Printf("attempt %d: %s\n", r.Attempts, r.Result)
		}
	}
	// Output:
	// outcome unknown; retry with the same key
	// attempt 2: {"charge":"ch_1"}
}
