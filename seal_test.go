package receipts_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/keyring"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// newKeyring creates a key file in a temporary directory.
func newKeyring(t testing.TB) *keyring.File {
	t.Helper()
	kr, err := keyring.Create(filepath.Join(t.TempDir(), "receipts.keyring"))
	require.NoError(t, err)
	return kr
}

// TestEncryptedResults: with a Keyring, a result is replayed, looked up and scanned in the
// clear, BeforeReplay sees the receipt without it, and a DB without the Keyring refuses to
// show it (ErrSealed) without running anything again.
func TestEncryptedResults(t *testing.T) {
	kr := newKeyring(t)
	var seen [][]byte
	s := newTestStore(t, func(o *pebblestore.Options) {
		o.Keyring = kr
		o.BeforeReplay = func(_ context.Context, r *receipts.Receipt) error {
			seen = append(seen, r.Result)
			return nil
		}
	})
	k := key("tenant", "op-1")
	fp := []byte("fp")
	runs := 0
	do := func(db *receipts.DB) (*receipts.Receipt, error) {
		return db.Do(bg, k, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			runs++
			return []byte("refund 42 to alice@example.com"), nil
		})
	}
	r, err := do(s.db)
	require.NoError(t, err)
	require.Equal(t, "refund 42 to alice@example.com", string(r.Result))
	for range 2 { // from the replay cache's memory, then from the engine
		r, err = do(s.db)
		require.NoError(t, err)
		require.Equal(t, "refund 42 to alice@example.com", string(r.Result))
		s.reopen()
	}
	r, err = s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, "refund 42 to alice@example.com", string(r.Result))
	r, err = s.db.Inspect(bg, k)
	require.NoError(t, err)
	require.Equal(t, "refund 42 to alice@example.com", string(r.Result))
	for r, err := range s.db.Scan(bg, receipts.Filter{}) {
		require.NoError(t, err)
		require.Equal(t, "refund 42 to alice@example.com", string(r.Result))
	}
	require.Equal(t, 1, runs)
	require.Len(t, seen, 3)
	for _, res := range seen {
		require.Nil(t, res, "BeforeReplay saw the result")
	}
	_, err = s.db.Do(bg, k, []byte("other"), func(context.Context, *receipts.Lease) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)

	// Without the Keyring: nothing runs, nothing is shown.
	s.opts.Keyring = nil
	s.opts.BeforeReplay = nil
	s.reopen()
	_, err = do(s.db)
	require.ErrorIs(t, err, receipts.ErrSealed)
	_, err = s.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrSealed)
	for _, err := range s.db.Scan(bg, receipts.Filter{}) {
		require.ErrorIs(t, err, receipts.ErrSealed)
	}
	require.Equal(t, 1, runs)
}

// TestEncryptionTurnedOn: results stored before the option stay readable, new ones are
// encrypted, and both replay.
func TestEncryptionTurnedOn(t *testing.T) {
	s := newTestStore(t, nil)
	before := key("tenant", "before")
	_, err := s.db.Do(bg, before, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("plain old result"), nil
	})
	require.NoError(t, err)
	s.opts.Keyring = newKeyring(t)
	s.reopen()
	after := key("tenant", "after")
	_, err = s.db.Do(bg, after, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("new secret result"), nil
	})
	require.NoError(t, err)
	for k, want := range map[receipts.Key]string{before: "plain old result", after: "new secret result"} {
		r, err := s.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			t.Fatal("ran again")
			return nil, nil
		})
		require.NoError(t, err)
		require.Equal(t, want, string(r.Result))
	}
	// the stored bytes: the old result as it was, the new one sealed
	raw := storedValues(t, s.db)
	require.True(t, containsAny(raw, []byte("plain old result")))
	require.False(t, containsAny(raw, []byte("new secret result")))
}

// TestSealedResultBound: a result's ciphertext does not open under another key or state.
func TestSealedResultBound(t *testing.T) {
	s := newTestStore(t, func(o *pebblestore.Options) { o.Keyring = newKeyring(t) })
	a, b := key("tenant", "a"), key("tenant", "b")
	for _, k := range []receipts.Key{a, b} {
		_, err := s.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte("result of " + k.ID), nil
		})
		require.NoError(t, err)
	}
	// Copy a's stored record (ciphertext, token and all) over b's: b's result must not open.
	pdb := pebblestore.DB(s.db)
	var aVal []byte
	var bKey []byte
	it, err := pdb.NewIter(&pebble.IterOptions{LowerBound: []byte("\x00rcptr"), UpperBound: []byte("\x00rcpts")})
	require.NoError(t, err)
	for it.First(); it.Valid(); it.Next() {
		switch {
		case bytes.HasSuffix(it.Key(), []byte("tenanta")):
			aVal = bytes.Clone(it.Value())
		case bytes.HasSuffix(it.Key(), []byte("tenantb")):
			bKey = bytes.Clone(it.Key())
		}
	}
	require.NoError(t, it.Close())
	require.NotNil(t, aVal)
	require.NotNil(t, bKey)
	require.NoError(t, pdb.Set(bKey, aVal, pebble.Sync))
	_, err = s.db.Lookup(bg, b)
	require.ErrorIs(t, err, receipts.ErrCorrupt)
	r, err := s.db.Lookup(bg, a)
	require.NoError(t, err)
	require.Equal(t, "result of a", string(r.Result))
}

// storedValues returns every value the store holds, read through Pebble.
func storedValues(t *testing.T, db *receipts.DB) [][]byte {
	t.Helper()
	it, err := pebblestore.DB(db).NewIter(nil)
	require.NoError(t, err)
	defer it.Close()
	var out [][]byte
	for it.First(); it.Valid(); it.Next() {
		out = append(out, bytes.Clone(it.Value()))
	}
	return out
}

func containsAny(vals [][]byte, marker []byte) bool {
	for _, v := range vals {
		if bytes.Contains(v, marker) {
			return true
		}
	}
	return false
}

// TestEncryptedAtRestPebble: a marker placed in 10,000 results appears in no file of the
// store's directory (WAL, sstables, manifest), nor of a checkpoint, when results are
// encrypted, and one placed in their scopes and IDs in none when keys are hashed
// (Options.HashKeys); without either the same scan finds them (the scan can fail).
func TestEncryptedAtRestPebble(t *testing.T) {
	n := 10_000
	for _, encrypt := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypt=%v", encrypt), func(t *testing.T) {
			dir := t.TempDir()
			o := &receipts.Options{GCInterval: -1}
			if encrypt { // and keys hashed (Options.HashKeys)
				o.Keyring, o.HashKeys = newKeyring(t), true
			}
			db, err := receipts.Open(filepath.Join(dir, "store"), o)
			require.NoError(t, err)
			marker := []byte("MARKER-7f3a9c-customer-secret")
			keyMarker := []byte("KEYMARK-alice@example.com")
			doMany(t, n, func(i int) error {
				k := receipts.Key{Scope: fmt.Sprintf("tenant-%d-%s", i%17, keyMarker), ID: fmt.Sprintf("op-%s-%d", keyMarker, i)}
				_, err := db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
					return fmt.Appendf(nil, "%d:%s:%d", i, marker, i), nil
				})
				return err
			})
			require.NoError(t, pebblestore.Checkpoint(db, filepath.Join(dir, "checkpoint")))
			require.NoError(t, pebblestore.DB(db).Flush()) // sstables as well as the WAL
			hits, keyHits := filesWith(t, dir, marker), filesWith(t, dir, keyMarker)
			require.NoError(t, db.Close())
			hits += filesWith(t, dir, marker)
			keyHits += filesWith(t, dir, keyMarker)
			if encrypt {
				require.Zero(t, hits, "files holding the marker")
				require.Zero(t, keyHits, "files holding the keys' marker")
			} else {
				require.NotZero(t, hits, "the scan found no marker in a store without encryption")
				require.NotZero(t, keyHits, "the scan found no key marker in a store without hashed keys")
			}
		})
	}
}

// doMany runs fn(0..n-1) on 32 goroutines (so that their commits share fsyncs).
func doMany(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	next := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
}

// filesWith counts the files under dir that contain marker. A file that vanishes while it
// is read (an open store's Pebble removing an obsolete WAL or sstable) is skipped: it is no
// longer at rest, what it held was flushed or compacted into files that are scanned, and
// the callers scan the directory again once the store is closed.
func filesWith(t *testing.T, dir string, marker []byte) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if bytes.Contains(b, marker) {
			n++
		}
		return nil
	})
	require.NoError(t, err)
	return n
}

// TestRewrapKeys: after a rotation of the key-encryption key and RewrapKeys, the old key
// version can be retired and every result still opens; none was rewritten.
func TestRewrapKeys(t *testing.T) {
	kr := newKeyring(t)
	s := newTestStore(t, func(o *pebblestore.Options) { o.Keyring = kr })
	for i := range 20 {
		k := key(fmt.Sprintf("tenant-%d", i%5), fmt.Sprint(i))
		_, err := s.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte("result " + k.ID), nil
		})
		require.NoError(t, err)
	}
	before := storedValues(t, s.db)
	v, err := kr.Rotate(bg)
	require.NoError(t, err)
	n, err := s.db.RewrapKeys(bg)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.NoError(t, kr.Retire(bg, v-1))
	s.reopen() // no data key in memory
	for i := range 20 {
		r, err := s.db.Lookup(bg, key(fmt.Sprintf("tenant-%d", i%5), fmt.Sprint(i)))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("result ", i), string(r.Result))
	}
	after := storedValues(t, s.db)
	results := 0 // the records' bytes are the same (only the data keys changed)
	for _, b := range before {
		if containsAny(after, b) {
			results++
		}
	}
	require.GreaterOrEqual(t, results, 20)
	rep, err := s.db.Check(bg)
	require.NoError(t, err)
	require.Empty(t, rep.Problems, "the data keys pass Check")
}
