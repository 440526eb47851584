package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
)

// TestPanickingStagedEffectAbandons (issue 43, item 2): on PostgreSQL too, a staged effect
// that panics abandons the claim at once: the next attempt takes the key over, Recovered,
// instead of getting ErrInProgress for a whole lease (an hour here). The panic reaches the
// caller, and the effect's insert is rolled back.
func TestPanickingStagedEffectAbandons(t *testing.T) {
	d := newTestDB(t)
	db, pool := d.openDB(Options{Options: receipts.Options{LeaseTTL: time.Hour}})
	insert, count := effects(t, pool, d.schema)
	k := receipts.Key{Scope: "s", ID: "pay"}
	var got any
	func() {
		defer func() { got = recover() }()
		_, _ = db.Do(bg, k, []byte("fp"), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
			l.Stage(receipts.EffectOn(func(ctx context.Context, tx pgx.Tx) error {
				if err := insert(ctx, tx, "pay"); err != nil {
					return err
				}
				panic("effect exploded")
			}))
			return []byte("ok"), nil
		})
	}()
	if got != "effect exploded" {
		t.Fatalf("the caller recovered %v, want the effect's panic", got)
	}
	l, r, err := db.Claim(bg, k, []byte("fp"))
	if err != nil || r != nil {
		t.Fatalf("the next attempt, at once: %v, %v", r, err)
	}
	if !l.Recovered() {
		t.Fatal("the next attempt is not Recovered")
	}
	if n := count(); n != 0 {
		t.Fatalf("%d effects written by the panicking effect", n)
	}
	if _, err := l.Commit(bg, []byte("reconciled")); err != nil {
		t.Fatal(err)
	}
}
