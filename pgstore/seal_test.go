package pgstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/keyring"
)

// openStore opens the store on d with o (Schema filled in) on a pool of its own.
func (d *testDB) openStore(t *testing.T, o receipts.Options) *receipts.DB {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(bg, d.poolConfig(16))
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(bg, pool, &Options{Schema: d.schema, Options: o})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(); pool.Close() })
	return db
}

func newKeyring(t testing.TB) *keyring.File {
	t.Helper()
	kr, err := keyring.Create(filepath.Join(t.TempDir(), "receipts.keyring"))
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// parallel runs fn(0..n-1) on 32 goroutines and returns the first error.
func parallel(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// TestEncryptedAtRestPostgres: with Options.Keyring, a marker placed in 10,000 results
// (recorded by Do, DoTx and CommitTx) appears in no file of the PostgreSQL cluster's data
// directory (tables, indexes, WAL), after a CHECKPOINT, nor, with Options.HashKeys, one
// placed in their scopes and IDs; without them the same scan finds both.
// Replays return the results in the clear, on this node and on another.
func TestEncryptedAtRestPostgres(t *testing.T) {
	leakCheck(t)
	dataDir := pgtest.DataDir(t)
	for _, encrypt := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypt=%v", encrypt), func(t *testing.T) {
			d := newTestDB(t)
			var o receipts.Options
			if encrypt { // and keys hashed (Options.HashKeys)
				o.Keyring, o.HashKeys = newKeyring(t), true
			}
			db, other := d.openStore(t, o), d.openStore(t, o)
			pool := d.mustPool(t)
			m := make([]byte, 8)
			_, _ = rand.Read(m)
			marker := "MARKER-" + hex.EncodeToString(m) // its own per run: the cluster is shared
			keyMarker := "KEYMARK-" + hex.EncodeToString(m[:4])
			result := func(i int) []byte { return fmt.Appendf(nil, "%d:%s:%d", i, marker, i) }
			const n = 10_000
			err := parallel(n, func(i int) error {
				k := receipts.Key{Scope: fmt.Sprintf("tenant-%d-%s", i%17, keyMarker), ID: fmt.Sprintf("op-%s-%d", keyMarker, i)}
				var err error
				switch i % 10 {
				case 0:
					_, err = DoTx(bg, db, k, []byte("fp"), func(context.Context, pgx.Tx, *receipts.Lease) ([]byte, error) {
						return result(i), nil
					})
				case 1:
					l, _, cerr := db.Claim(bg, k, []byte("fp"))
					if cerr != nil {
						return cerr
					}
					err = pgx.BeginFunc(bg, pool, func(tx pgx.Tx) error {
						_, err := CommitTx(bg, tx, l, result(i))
						return err
					})
				default:
					_, err = db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
						return result(i), nil
					})
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{0, 1, 2, 9_999} {
				k := receipts.Key{Scope: fmt.Sprintf("tenant-%d-%s", i%17, keyMarker), ID: fmt.Sprintf("op-%s-%d", keyMarker, i)}
				for _, x := range []*receipts.DB{db, other} {
					r, err := x.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
						return nil, fmt.Errorf("ran again")
					})
					if err != nil || !bytes.Equal(r.Result, result(i)) {
						t.Fatalf("replay of %d: %q %v", i, r.Result, err)
					}
				}
			}
			if _, err := pool.Exec(bg, "CHECKPOINT"); err != nil {
				t.Fatal(err)
			}
			hits, keyHits := filesWith(t, dataDir, []byte(marker)), filesWith(t, dataDir, []byte(keyMarker))
			if encrypt && len(hits)+len(keyHits) > 0 {
				t.Fatalf("the markers are in files of the data directory: results %v, keys %v", hits, keyHits)
			}
			if !encrypt && (len(hits) == 0 || len(keyHits) == 0) {
				t.Fatal("the scan found no marker without encryption and hashed keys: it proves nothing")
			}
			t.Logf("files holding the results' marker: %d, the keys' marker: %d", len(hits), len(keyHits))
		})
	}
}

// mustPool is a pool on d, closed when t ends.
func (d *testDB) mustPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(bg, d.poolConfig(8))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// filesWith returns the files under dir that contain marker.
func filesWith(t *testing.T, dir string, marker []byte) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) { // a file the server removed meanwhile (a WAL segment recycled)
				return nil
			}
			return err
		}
		if e.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if bytes.Contains(b, marker) {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
