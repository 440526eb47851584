package pgstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/keyring"
	"github.com/receiptstore/receipts/receiptstest"
)

// TestEraseEndsWhileAnotherNodeHoldsTheKey (issue 43, item 1, two nodes): node a holds a
// scope's data key in memory (it recorded a result of the scope), node b erases the scope,
// and the erasure ends (tombstones off, a short Retention, the store's clock moved past its
// end). a's next result of the scope must not be sealed with the erased key: b replays it
// (it used to read ErrErased, the store holding no data key for the scope). And once b has
// made the scope's next data key, a's results still open on b (they used to fail there as
// ErrCorrupt, sealed with the old key), and b's on a.
func TestEraseEndsWhileAnotherNodeHoldsTheKey(t *testing.T) {
	d := newTestDB(t)
	path := filepath.Join(t.TempDir(), "receipts.keyring")
	if _, err := keyring.Create(path); err != nil {
		t.Fatal(err)
	}
	clock := receiptstest.NewClock(receiptstest.DefaultStart)
	node := func() *receipts.DB { // a process of its own: its own copy of the key file
		kr, err := keyring.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return d.openStore(t, receipts.Options{Keyring: kr, Retention: time.Hour, TombstoneWindow: -1, Now: clock.Now})
	}
	a, b := node(), node()
	do := func(t *testing.T, db *receipts.DB, scope, id string) {
		t.Helper()
		want := scope + "/" + id
		r, err := db.Do(bg, receipts.Key{Scope: scope, ID: id}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte(want), nil
		})
		if err != nil || string(r.Result) != want {
			t.Fatalf("Do %s: %v, %v", want, r, err)
		}
	}
	lookup := func(t *testing.T, db *receipts.DB, scope, id, who string) {
		t.Helper()
		want := scope + "/" + id
		r, err := db.Lookup(bg, receipts.Key{Scope: scope, ID: id})
		if err != nil {
			t.Fatalf("Lookup of %s on %s: %v", want, who, err)
		}
		if string(r.Result) != want {
			t.Fatalf("Lookup of %s on %s: %q, want %q", want, who, r.Result, want)
		}
	}
	erase := func(t *testing.T, scope string) {
		t.Helper()
		st, err := b.EraseScope(bg, scope)
		if err != nil || !st.KeyDestroyed {
			t.Fatalf("EraseScope: %+v, %v", st, err)
		}
		clock.Set(st.Until.Add(time.Second)) // the erasure has ended
	}

	t.Run("no next key yet", func(t *testing.T) {
		do(t, a, "s1", "before") // a holds s1's data key
		erase(t, "s1")
		do(t, a, "s1", "after")
		lookup(t, b, "s1", "after", "the other node")
		lookup(t, a, "s1", "after", "the node that recorded it")
	})
	t.Run("DoTx", func(t *testing.T) { // the seal reads the erasure count in DoTx's transaction
		do(t, a, "s3", "before")
		erase(t, "s3")
		r, err := DoTx(bg, a, receipts.Key{Scope: "s3", ID: "after"}, []byte("fp"), func(context.Context, pgx.Tx, *receipts.Lease) ([]byte, error) {
			return []byte("s3/after"), nil
		})
		if err != nil || string(r.Result) != "s3/after" {
			t.Fatalf("DoTx: %v, %v", r, err)
		}
		lookup(t, b, "s3", "after", "the other node")
	})
	t.Run("the other node made the next key", func(t *testing.T) {
		do(t, a, "s2", "before")
		erase(t, "s2")
		do(t, b, "s2", "b-after") // b makes the scope's next data key
		do(t, a, "s2", "a-after")
		lookup(t, b, "s2", "a-after", "the node that made the next key")
		lookup(t, a, "s2", "b-after", "the node that held the old key")
		lookup(t, a, "s2", "a-after", "the node that recorded it")
	})
}

// TestSealedDoTxOnAFullPool: the check that a data key is still the scope's (seal.go reads
// the scope's erasure count before each seal) runs in DoTx's own transaction, which holds the
// scope's lock, not on another connection of the pool: as many encrypted DoTx calls as the
// pool has connections, all committing at once, commit (they used to wait for a connection
// none of them would give back, until their context ended).
func TestSealedDoTxOnAFullPool(t *testing.T) {
	d := newTestDB(t)
	const conns = 3
	pool, err := pgxpool.NewWithConfig(bg, d.poolConfig(conns))
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(bg, pool, &Options{Schema: d.schema, Options: receipts.Options{Keyring: newKeyring(t)}})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(); pool.Close() })
	if _, err := db.Do(bg, receipts.Key{Scope: "s", ID: "warm"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("the scope's data key is in memory"), nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, time.Minute) // bounds the claims; the seal runs detached: a hang shows as the test binary's timeout
	defer cancel()
	var entered sync.WaitGroup
	entered.Add(conns)
	errs := make(chan error, conns)
	for i := range conns {
		go func() {
			_, err := DoTx(ctx, db, receipts.Key{Scope: "s", ID: fmt.Sprint("tx-", i)}, []byte("fp"), func(context.Context, pgx.Tx, *receipts.Lease) ([]byte, error) {
				entered.Done()
				entered.Wait() // every connection is held by a DoTx now
				return []byte("sealed"), nil
			})
			errs <- err
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			t.Fatalf("an encrypted DoTx on a full pool: %v", err)
		}
	}

	// fn's transaction aborted by a failed statement fn ignored: the seal's read fails in it
	// at once, and the outcome is unknown, as without a Keyring
	entered.Add(conns)
	for i := range conns {
		go func() {
			_, err := DoTx(ctx, db, receipts.Key{Scope: "s", ID: fmt.Sprint("aborted-", i)}, []byte("fp"), func(ctx context.Context, tx pgx.Tx, _ *receipts.Lease) ([]byte, error) {
				_, _ = tx.Exec(ctx, "SELECT 1/0")
				entered.Done()
				entered.Wait()
				return []byte("sealed"), nil
			})
			errs <- err
		}()
	}
	for range conns {
		if err := <-errs; !errors.Is(err, receipts.ErrOutcomeUnknown) {
			t.Fatalf("an encrypted DoTx whose transaction is aborted, on a full pool: %v", err)
		}
	}
}
