package receipts

import (
	"context"
	"fmt"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/seal"
)

// Lookup returns the visible record of k in any state (a Pending claim
// included), after Options.BeforeReplay. It returns ErrNotFound if there is
// none; for a key whose tombstone is in force (Options.TombstoneWindow), an
// *ExpiredError that matches both ErrNotFound and ErrExpired.
func (db *DB) Lookup(ctx context.Context, k Key) (*Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	r, sealed, err := db.lookupSealed(ctx, k)
	if err != nil {
		return nil, err
	}
	if err := db.beforeReplay(ctx, r); err != nil {
		return nil, err
	}
	if sealed != nil { // decrypted once BeforeReplay allowed it (seal.go)
		if err := db.unseal(ctx, r, sealed); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Inspect is Lookup for operators, as Scan is: it returns the visible record
// of k in any state (ErrNotFound if there is none) without calling
// Options.BeforeReplay. It writes nothing and counts no call (like Lookup,
// it may be answered from the replay cache, and fill it). Use it in tools that show every
// scope's records, such as the admin handler (package receiptadmin), and
// keep them behind the service's operator authentication.
func (db *DB) Inspect(ctx context.Context, k Key) (*Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	return db.lookup(ctx, k)
}

// lookup reads k's visible record from the engine, its result in the clear.
func (db *DB) lookup(ctx context.Context, k Key) (*Receipt, error) {
	r, sealed, err := db.lookupSealed(ctx, k)
	if err == nil && sealed != nil {
		err = db.unseal(ctx, r, sealed)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// lookupSealed reads k's visible record from the engine. If its result is encrypted
// (Options.Keyring), the receipt comes without it (nil), and sealed is the record to
// decrypt it from (unseal).
func (db *DB) lookupSealed(ctx context.Context, k Key) (r *Receipt, sealed *driver.Record, err error) {
	if err := k.validate(); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sk, err := db.storedKey(k) // Options.HashKeys (privacy.go)
	if err != nil {
		return nil, nil, err
	}
	rec, found, now, err := db.eng.Lookup(ctx, sk)
	if err != nil {
		return nil, nil, err
	}
	if !found {
		if e, err := db.erasedScope(ctx, k, now); err != nil || e != nil {
			if e != nil {
				return nil, nil, e
			}
			return nil, nil, err
		}
		if t, err := db.tombstone(ctx, k); err != nil {
			return nil, nil, err
		} else if t != nil {
			return nil, nil, &ExpiredError{Key: k, ExpiredAt: t.ExpiredAt, Until: t.Until, notFound: true, db: db}
		}
		return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, db.keyName(k))
	}
	r = newReceipt(&rec)
	r.Key = k // the caller's (the record's is the stored key)
	if seal.IsSealed(rec.Result) {
		r.Result = nil
		return r, &rec, nil
	}
	return r, nil, nil
}
