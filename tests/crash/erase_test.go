package crash_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/keyring"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/receiptstore/receipts/tests/internal/workload"
)

// TestCrashDuringErase crashes the machine (a CrashClone of Pebble's crashable FS, keeping
// exactly the synced data, or a random part of the unsynced data too) at a random moment
// of EraseScope, while claims of the scope and of another one run, and checks the image:
// the scope is either whole (every receipt there, its result readable with the key file as
// it was at the crash) or erased (nothing of it readable, its keys refused, and GC finishes
// the key's destruction if the crash interrupted it), and the other scope is untouched.
// Both outcomes must be seen.
func TestCrashDuringErase(t *testing.T) {
	runs := testkit.EnvInt("RECEIPTS_ERASE_CRASHES", 40)
	if testkit.Soak() {
		runs = testkit.EnvInt("RECEIPTS_ERASE_CRASHES", 1000)
	}
	seed := testkit.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0xe7a5e))
	ctx := context.Background()
	const victims, others = 60, 20
	var whole, erased int
	var d time.Duration // how long an erasure takes here, measured on the first run
	for run := range runs {
		fs := vfs.NewCrashableMem()
		clock := receiptstest.NewClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
		krPath := filepath.Join(t.TempDir(), "receipts.keyring")
		kr, err := keyring.Create(krPath)
		if err != nil {
			t.Fatal(err)
		}
		open := func(fs vfs.FS, kr receipts.Keyring) *receipts.DB {
			t.Helper()
			db, err := pebblestore.Open("db", &pebblestore.Options{
				Options: receipts.Options{
					Retention:  time.Hour,
					GCInterval: -1,
					Now:        clock.Now,
					Keyring:    kr,
					Logger:     slog.New(slog.DiscardHandler),
				},
				Pebble: &pebble.Options{FS: fs, Logger: &workload.TestLogger{}},
			})
			if err != nil {
				t.Fatalf("run %d: open: %v", run, err)
			}
			return db
		}
		db := open(fs, kr)
		result := func(k receipts.Key) []byte { return []byte("result of " + k.Scope + "/" + k.ID) }
		do := func(k receipts.Key) error {
			_, err := db.Do(ctx, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return result(k), nil })
			return err
		}
		for i := range victims {
			if err := do(receipts.Key{Scope: "victim", ID: fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range others {
			if err := do(receipts.Key{Scope: "other", ID: fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
		}

		// Load on both scopes while the erasure runs.
		var stop atomic.Bool
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					scope := []string{"victim", "other"}[i%2]
					err := do(receipts.Key{Scope: scope, ID: fmt.Sprintf("load-%d-%d", w, i)})
					if err != nil && !errors.Is(err, receipts.ErrErased) && !errors.Is(err, receipts.ErrLeaseLost) &&
						!errors.Is(err, receipts.ErrOutcomeUnknown) && !errors.Is(err, receipts.ErrClosed) {
						t.Errorf("run %d: load: %v", run, err)
						return
					}
				}
			})
		}
		var delay time.Duration
		if d > 0 {
			delay = time.Duration(rng.Int64N(int64(2 * d)))
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := db.EraseScope(ctx, "victim")
			done <- err
		}()
		var image *vfs.MemFS
		var keys []byte
		if d > 0 {
			for time.Since(start) < delay { // spin: sleeps are coarser than an erasure
			}
			// The key file first: whatever it holds was done before the image's syncs.
			if keys, err = os.ReadFile(krPath); err != nil {
				t.Fatal(err)
			}
			cfg := vfs.CrashCloneCfg{}
			if rng.IntN(2) == 1 {
				cfg.UnsyncedDataPercent = 10 + rng.IntN(91)
				cfg.RNG = rand.New(rand.NewPCG(rng.Uint64(), 1))
			}
			image = fs.CrashClone(cfg)
		}
		if err := <-done; err != nil {
			t.Fatalf("run %d: erase: %v", run, err)
		}
		if d == 0 {
			d = max(time.Since(start), 100*time.Microsecond)
		}
		stop.Store(true)
		wg.Wait()
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if image == nil {
			continue // the measuring run
		}

		// The image, with the key file as it was at the crash.
		krCopy := filepath.Join(t.TempDir(), "keyring.at-crash")
		if err := os.WriteFile(krCopy, keys, 0o600); err != nil {
			t.Fatal(err)
		}
		kc, err := keyring.Open(krCopy)
		if err != nil {
			t.Fatal(err)
		}
		db = open(image, kc)
		var ledger []receipts.EraseStats
		for e, err := range db.Erasures(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			ledger = append(ledger, e)
		}
		if len(ledger) == 0 { // whole
			whole++
			for i := range victims {
				k := receipts.Key{Scope: "victim", ID: fmt.Sprint(i)}
				r, err := db.Lookup(ctx, k)
				if err != nil || string(r.Result) != string(result(k)) {
					t.Fatalf("run %d: no erasure in the image, but %v: %v %v", run, k, r, err)
				}
			}
		} else { // erased
			erased++
			for r, err := range db.Scan(ctx, receipts.Filter{Scope: "victim"}) {
				t.Fatalf("run %d: erased, but a record of the scope is there: %v %v", run, r, err)
			}
			for i := range victims {
				k := receipts.Key{Scope: "victim", ID: fmt.Sprint(i)}
				if _, err := db.Lookup(ctx, k); !errors.Is(err, receipts.ErrErased) {
					t.Fatalf("run %d: erased, but Lookup(%v): %v", run, k, err)
				}
				if _, _, err := db.Claim(ctx, k, []byte("fp")); !errors.Is(err, receipts.ErrErased) {
					t.Fatalf("run %d: erased, but Claim(%v): %v", run, k, err)
				}
			}
			if _, err := db.GC(ctx); err != nil { // finishes the key's destruction, if the crash cut it
				t.Fatal(err)
			}
			for e, err := range db.Erasures(ctx) {
				if err != nil || !e.KeyDestroyed {
					t.Fatalf("run %d: after GC the erasure's key is not destroyed: %+v %v", run, e, err)
				}
			}
		}
		for i := range others {
			k := receipts.Key{Scope: "other", ID: fmt.Sprint(i)}
			if r, err := db.Lookup(ctx, k); err != nil || string(r.Result) != string(result(k)) {
				t.Fatalf("run %d: the other scope's %v: %v", run, k, err)
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d crash images: %d whole, %d erased (erasure took about %s)", runs-1, whole, erased, d)
	if whole == 0 || erased == 0 {
		t.Fatalf("the crashes hit one side only (%d whole, %d erased): the test proves little", whole, erased)
	}
}
