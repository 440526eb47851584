package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
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

	// DoTx: the same, the claim abandoned in DoTx's transaction, fn's insert rolled back
	k = receipts.Key{Scope: "s", ID: "pay-tx"}
	got = nil
	func() {
		defer func() { got = recover() }()
		_, _ = DoTx(bg, db, k, []byte("fp"), func(ctx context.Context, tx pgx.Tx, l *receipts.Lease) ([]byte, error) {
			l.Stage(receipts.EffectOn(func(context.Context, pgx.Tx) error { panic("effect exploded") }))
			return []byte("ok"), insert(ctx, tx, "pay-tx")
		})
	}()
	if got != "effect exploded" {
		t.Fatalf("DoTx: the caller recovered %v, want the effect's panic", got)
	}
	l, r, err = db.Claim(bg, k, []byte("fp"))
	if err != nil || r != nil || !l.Recovered() {
		t.Fatalf("DoTx: the next attempt, at once: %v, %v", r, err)
	}
	if n := count(); n != 0 {
		t.Fatalf("DoTx: %d effects written", n)
	}
	if err := l.Abandon(bg); err != nil {
		t.Fatal(err)
	}
}

// TestEffectThatCommitsItself (issue 43, item 2): a staged effect that sends COMMIT through
// its pgx.Tx (tx.Commit is refused; Exec is not) and then returns an error has made its
// writes durable, so "nothing is written" cannot hold: the commit fails with an error that
// says what the effect did (driver.ErrEffectEnded, ErrOutcomeUnknown), no receipt is recorded, and
// the claim is abandoned at once (the next attempt is Recovered), never left to be released.
// Through Lease.Commit and through Do.
func TestEffectThatCommitsItself(t *testing.T) {
	d := newTestDB(t)
	db, pool := d.openDB(Options{Options: receipts.Options{LeaseTTL: time.Hour}})
	insert, count := effects(t, pool, d.schema)
	committing := func(id string, fail bool) receipts.Effect {
		return receipts.EffectOn(func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, id); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "COMMIT"); err != nil {
				return err
			}
			if fail {
				return errors.New("the provider said no")
			}
			return nil
		})
	}
	check := func(t *testing.T, k receipts.Key, err error, effects int) {
		t.Helper()
		if !errors.Is(err, driver.ErrEffectEnded) || !errors.Is(err, receipts.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "COMMIT") {
			t.Fatalf("the commit: %v; want ErrEffectEnded and ErrOutcomeUnknown, saying the effect sent COMMIT", err)
		}
		if n := count(); n != effects {
			t.Fatalf("%d effects durable, want %d", n, effects)
		}
		l, r, err := db.Claim(bg, k, []byte("fp"))
		if err != nil || r != nil || !l.Recovered() {
			t.Fatalf("the next attempt, at once: %v, %v; want a Recovered lease", r, err)
		}
		if err := l.Abandon(bg); err != nil {
			t.Fatal(err)
		}
	}
	for i, fail := range []bool{true, false} {
		t.Run(fmt.Sprintf("Commit/fails=%v", fail), func(t *testing.T) {
			k := receipts.Key{Scope: "s", ID: fmt.Sprintf("commit-%v", fail)}
			l, _, err := db.Claim(bg, k, []byte("fp"))
			if err != nil {
				t.Fatal(err)
			}
			l.Stage(committing(k.ID, fail))
			r, err := l.Commit(bg, []byte("ok"))
			if r != nil {
				t.Fatalf("a receipt: %+v", r)
			}
			if rerr := l.Release(bg); !errors.Is(rerr, driver.ErrEffectEnded) { // it could run the effect twice
				t.Fatalf("Release after the effect ended the transaction: %v", rerr)
			}
			check(t, k, err, 2*i+1)
		})
		t.Run(fmt.Sprintf("Do/fails=%v", fail), func(t *testing.T) {
			k := receipts.Key{Scope: "s", ID: fmt.Sprintf("do-%v", fail)}
			_, err := db.Do(bg, k, []byte("fp"), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
				l.Stage(committing(k.ID, fail))
				return []byte("ok"), nil
			})
			check(t, k, err, 2*i+2)
		})
	}
}
