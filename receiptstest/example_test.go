package receiptstest_test

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptstest"
)

// dirStore opens each store in a directory of its own and reopens it there.
// An engine's Store does the same with its own resources (a schema in a
// PostgreSQL database, say), and frees them when the test ends.
type dirStore struct {
	mu   sync.Mutex
	dirs map[*receipts.DB]string
}

func (s *dirStore) Open(t testing.TB, opts receipts.Options) (*receipts.DB, error) {
	return s.open(t, filepath.Join(t.TempDir(), "db"), opts)
}

func (s *dirStore) Reopen(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	dir := s.dirs[db]
	s.mu.Unlock()
	if err := db.Close(); err != nil {
		return nil, err
	}
	return s.open(t, dir, opts)
}

func (s *dirStore) open(t testing.TB, dir string, opts receipts.Options) (*receipts.DB, error) {
	db, err := receipts.Open(dir, &opts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.dirs == nil {
		s.dirs = map[*receipts.DB]string{}
	}
	s.dirs[db] = dir
	s.mu.Unlock()
	t.Cleanup(func() { _ = db.Close() })
	return db, nil
}

// An engine runs the whole contract from one test:
//
//	func TestConformance(t *testing.T) { receiptstest.Run(t, &dirStore{}) }
func Example() {
	var _ receiptstest.Store = &dirStore{}
	var _ = receiptstest.Run
}
