package receiptstest

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// PebbleStore is the Store of the embedded engine (receipts.Open): each
// store in a directory of its own, under t.TempDir on disk, or, with Mem, on
// a vfs.NewMem of its own, which Reopen reuses. It implements Corrupter.
// The zero PebbleStore opens stores on disk; it is safe for concurrent use.
//
//	receiptstest.Run(t, &receiptstest.PebbleStore{Mem: true})
type PebbleStore struct {
	// Mem keeps each store on an in-memory file system of its own.
	Mem bool

	mu     sync.Mutex
	places map[*receipts.DB]pebblePlace // protected by mu
}

// pebblePlace is where a store lives.
type pebblePlace struct {
	dir string
	fs  vfs.FS // nil: the OS
}

// Open implements Store.
func (s *PebbleStore) Open(t testing.TB, opts receipts.Options) (*receipts.DB, error) {
	p := pebblePlace{dir: filepath.Join(t.TempDir(), "db")}
	if s.Mem {
		p = pebblePlace{dir: "db", fs: vfs.NewMem()}
	}
	return s.open(t, p, opts)
}

// Reopen implements Store.
func (s *PebbleStore) Reopen(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	p, ok := s.places[db]
	s.mu.Unlock()
	if !ok {
		t.Fatalf("Reopen of a store this Store did not open")
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	ndb, err := s.open(t, p, opts)
	if err == nil {
		s.mu.Lock()
		delete(s.places, db)
		s.mu.Unlock()
	}
	return ndb, err
}

func (s *PebbleStore) open(t testing.TB, p pebblePlace, opts receipts.Options) (*receipts.DB, error) {
	po := pebblestore.Options{Options: opts}
	if p.fs != nil {
		po.Pebble = &pebble.Options{FS: p.fs}
	}
	db, err := pebblestore.Open(p.dir, &po)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.places == nil {
		s.places = map[*receipts.DB]pebblePlace{}
	}
	s.places[db] = p
	s.mu.Unlock()
	t.Cleanup(func() { _ = db.Close() })
	return db, nil
}

// Corrupt implements Corrupter: it writes garbage over k's record (found
// through the engine's key layout), synced.
func (s *PebbleStore) Corrupt(t testing.TB, db *receipts.DB, k receipts.Key) {
	it, err := pebblestore.DB(db).NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	require.NoError(t, err)
	var rk []byte
	for ok := it.First(); ok; ok = it.Next() {
		_, scope, id, err := keys.ParseRecord(it.Key())
		require.NoError(t, err)
		if scope == k.Scope && id == k.ID {
			rk = append([]byte{}, it.Key()...)
		}
	}
	require.NoError(t, it.Close())
	require.NotNil(t, rk, "no record of %s", k)
	require.NoError(t, pebblestore.DB(db).Set(rk, []byte("\x8f\x13garbage\xff\x00\x01 that is not a record"), pebble.Sync))
}
