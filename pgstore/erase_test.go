package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/keyring"
)

// TestEraseUnderCrash crashes PostgreSQL (pg_ctl restart -m immediate) at a random moment of
// an EraseScope on one node, while another node claims in the erased scope and in another
// one, and checks the store once the server is back: the scope is either whole (every receipt
// there, readable) or erased (nothing of it readable, its keys refused), and the other scope
// is untouched. An erasure that returned before the crash must be there.
func TestEraseUnderCrash(t *testing.T) {
	if err := pgtest.Restart(t); errors.Is(err, pgtest.ErrExternal) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	runs := 4
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var whole, erased int
	for run := range runs {
		d := newTestDB(t)
		kr, err := keyring.Create(t.TempDir() + "/k")
		if err != nil {
			t.Fatal(err)
		}
		o := receipts.Options{Keyring: kr, Logger: discard()}
		a, b := d.openStore(t, o), d.openStore(t, o)
		result := func(k receipts.Key) []byte { return []byte("result of " + k.String()) }
		const victims, others = 100, 20
		fill := func(scope string, n int) {
			err := parallel(n, func(i int) error {
				k := receipts.Key{Scope: scope, ID: fmt.Sprint(i)}
				_, err := a.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return result(k), nil })
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		fill("victim", victims)
		fill("other", others)
		var stop atomic.Bool
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					k := receipts.Key{Scope: []string{"victim", "other"}[i%2], ID: fmt.Sprintf("load-%d-%d", w, i)}
					_, _ = b.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return result(k), nil })
				}
			})
		}
		done := make(chan error, 1)
		go func() {
			_, err := a.EraseScope(bg, "victim")
			done <- err
		}()
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		if err := pgtest.Restart(t); err != nil {
			t.Fatal(err)
		}
		eraseErr := <-done
		stop.Store(true)
		wg.Wait()

		c := d.openStore(t, o)
		var ledger int
		for _, err := range c.Erasures(bg) {
			if err != nil {
				t.Fatal(err)
			}
			ledger++
		}
		if eraseErr == nil && ledger == 0 {
			t.Fatalf("run %d: EraseScope returned nil, and no erasure is recorded", run)
		}
		if ledger == 0 {
			whole++
			for i := range victims {
				k := receipts.Key{Scope: "victim", ID: fmt.Sprint(i)}
				r, err := c.Lookup(bg, k)
				if err != nil || string(r.Result) != string(result(k)) {
					t.Fatalf("run %d: no erasure, but %v: %v", run, k, err)
				}
			}
		} else {
			erased++
			for r, err := range c.Scan(bg, receipts.Filter{Scope: "victim"}) {
				t.Fatalf("run %d: erased, but a record of the scope is there: %v %v", run, r, err)
			}
			for i := range victims {
				k := receipts.Key{Scope: "victim", ID: fmt.Sprint(i)}
				if _, err := c.Lookup(bg, k); !errors.Is(err, receipts.ErrErased) {
					t.Fatalf("run %d: erased, but Lookup(%v): %v", run, k, err)
				}
			}
			if _, _, err := c.Claim(bg, receipts.Key{Scope: "victim", ID: "0"}, []byte("fp")); !errors.Is(err, receipts.ErrErased) {
				t.Fatalf("run %d: erased, but a claim: %v", run, err)
			}
		}
		for i := range others {
			k := receipts.Key{Scope: "other", ID: fmt.Sprint(i)}
			if r, err := c.Lookup(bg, k); err != nil || string(r.Result) != string(result(k)) {
				t.Fatalf("run %d: the other scope's %v: %v", run, k, err)
			}
		}
		t.Logf("run %d: erase returned %v; the store is %s", run, eraseErr, map[bool]string{true: "whole", false: "erased"}[ledger == 0])
	}
	t.Logf("%d runs: %d whole, %d erased", runs, whole, erased)
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
