package pebblestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/pebblestore"
)

// A work-item service (like examples/http-workitems): the work item and its
// receipt commit in one synced batch, so they can never be separated by a
// crash.
func ExampleCommitWith() {
	dir, _ := os.MkdirTemp("", "receipts-example")
	defer os.RemoveAll(dir)
	db, err := pebblestore.Open(dir, nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()

	create := func(caller, opKey, title string) (int, error) {
		fp, err := encoding.Fingerprint(map[string]any{"title": title})
		if err != nil {
			return 0, err
		}
		lease, r, err := db.Claim(ctx, receipts.Key{Scope: caller, ID: opKey}, fp)
		if err != nil {
			return 0, err
		}
		if r == nil {
			next := nextItemID(db)
			result, _ := json.Marshal(next)
			r, err = pebblestore.CommitWith(ctx, lease, result, func(b *pebble.Batch) error {
				return b.Set(fmt.Appendf(nil, "items/%08d", next), []byte(title), nil)
			})
			if err != nil {
				return 0, err
			}
		}
		var id int
		err = json.Unmarshal(r.Result, &id)
		return id, err
	}

	first, _ := create("account-a", "approved-action-17", "Review evals")
	retry, _ := create("account-a", "approved-action-17", "Review evals")
	second, _ := create("account-a", "approved-action-18", "Review evals")
	_, err = create("account-a", "approved-action-17", "Different work")
	fmt.Println(first, retry, second, errors.Is(err, receipts.ErrIntentMismatch))
	fmt.Println("items:", nextItemID(db)-1)
	// Output:
	// 1 1 2 true
	// items: 2
}

// nextItemID counts the items stored so far (the example is sequential).
func nextItemID(db *receipts.DB) int {
	it, _ := pebblestore.DB(db).NewIter(&pebble.IterOptions{LowerBound: []byte("items/"), UpperBound: []byte("items0")})
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	return n + 1
}
