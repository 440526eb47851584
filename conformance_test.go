package receipts_test

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// TestConformance runs the contract kit (package receiptstest) on the
// Pebble engine, on disk and on Pebble's in-memory FS.
//
//	go test -run 'TestConformance/mem/Lease/' .
func TestConformance(t *testing.T) {
	t.Run("disk", func(t *testing.T) { receiptstest.Run(t, &pebbleStore{}) })
	t.Run("mem", func(t *testing.T) { receiptstest.Run(t, &pebbleStore{mem: true}) })
}

// pebbleStore opens each store in a directory of its own: under t.TempDir
// on disk, or on a vfs.NewMem of its own, which Reopen reuses.
type pebbleStore struct {
	mem bool

	mu     sync.Mutex
	places map[*receipts.DB]place // protected by mu
}

// place is where a store lives.
type place struct {
	dir string
	fs  vfs.FS // nil: the OS
}

func (s *pebbleStore) Open(t testing.TB, opts receipts.Options) (*receipts.DB, error) {
	p := place{dir: filepath.Join(t.TempDir(), "db")}
	if s.mem {
		p = place{dir: "db", fs: vfs.NewMem()}
	}
	return s.open(t, p, opts)
}

func (s *pebbleStore) Reopen(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error) {
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

func (s *pebbleStore) open(t testing.TB, p place, opts receipts.Options) (*receipts.DB, error) {
	if p.fs != nil {
		opts.Pebble = &pebble.Options{FS: p.fs}
	}
	db, err := receipts.Open(p.dir, &opts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.places == nil {
		s.places = map[*receipts.DB]place{}
	}
	s.places[db] = p
	s.mu.Unlock()
	t.Cleanup(func() { _ = db.Close() })
	return db, nil
}

// Corrupt writes garbage over k's record key (found through the layout in
// internal/keys), synced.
func (s *pebbleStore) Corrupt(t testing.TB, db *receipts.DB, k receipts.Key) {
	it, err := db.Pebble().NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
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
	require.NoError(t, db.Pebble().Set(rk, []byte("\x8f\x13garbage\xff\x00\x01 that is not a record"), pebble.Sync))
}
