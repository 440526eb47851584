package receipts_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
)

// The README's Quick start: a refund that runs once however often it is
// retried, with the provider's idempotency key, a definitive failure and a
// reused key with other arguments.
func Example() {
	dir, _ := os.MkdirTemp("", "receipts-quickstart")
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil) // Retention 24h, LeaseTTL 30s
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()

	refunds := 0 // how often the provider really refunded
	refund := func(caller, opKey string, amount int) {
		// Scope: the authenticated caller. ID: the operation key minted at approval time.
		k := receipts.Key{Scope: caller, ID: opKey}
		fp, err := encoding.Fingerprint(map[string]any{"amount": amount}) // raw args are never stored
		if err != nil {
			panic(err)
		}
		r, err := db.Do(ctx, k, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			if l.Recovered() {
				// An earlier attempt crashed or timed out mid-effect: ask the
				// provider whether l.ProviderKey() already went through.
			}
			switch {
			case amount <= 0: // rejected before anything happened: the key is free again
				return nil, receipts.NotPerformed(errors.New("invalid amount"))
			case amount > 1000: // the provider declined: stored as Failed and replayed
				return []byte("declined"), receipts.Permanent(errors.New("over limit"))
			}
			refunds++ // the effect; send l.ProviderKey() as its Idempotency-Key
			return json.Marshal(map[string]any{"refund": refunds, "amount": amount})
		})
		switch {
		case errors.Is(err, receipts.ErrIntentMismatch): // same key, other arguments: 422
			fmt.Println(opKey, "rejected: other arguments")
		case errors.Is(err, receipts.ErrInProgress): // another caller holds the key: 409
			fmt.Println(opKey, "in progress")
		case errors.Is(err, receipts.ErrFailed): // a definitive failure, first time or replayed
			fmt.Println(opKey, "failed:", string(r.Result))
		case err != nil:
			fmt.Println(opKey, "error:", err)
		default: // r.Result is the stored result, identical on every retry
			fmt.Println(opKey, "ok:", string(r.Result))
		}
	}

	refund("alice", "op-1", 120)
	refund("alice", "op-1", 120) // the first response was lost: replayed, not refunded again
	refund("alice", "op-1", 999) // the same key with other arguments
	refund("alice", "op-2", 5000)
	refund("alice", "op-2", 5000)
	fmt.Println("refunds:", refunds)
	// Output:
	// op-1 ok: {"amount":120,"refund":1}
	// op-1 ok: {"amount":120,"refund":1}
	// op-1 rejected: other arguments
	// op-2 failed: declined
	// op-2 failed: declined
	// refunds: 1
}
