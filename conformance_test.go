package receipts_test

import (
	"testing"

	"github.com/receiptstore/receipts/receiptstest"
)

// TestConformance runs the contract kit (package receiptstest) on the
// Pebble engine, on disk and on Pebble's in-memory FS.
//
//	go test -run 'TestConformance/mem/Lease/' .
func TestConformance(t *testing.T) {
	t.Run("disk", func(t *testing.T) { receiptstest.Run(t, &receiptstest.PebbleStore{}) })
	t.Run("mem", func(t *testing.T) { receiptstest.Run(t, &receiptstest.PebbleStore{Mem: true}) })
}

// Backup takes a Checkpoint (receiptstest.Backup).
func (s *pebbleStore) Backup(t testing.TB, db *receipts.DB) func(opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	p := s.places[db]
	s.mu.Unlock()
	cp := place{dir: filepath.Join(t.TempDir(), "checkpoint"), fs: p.fs}
	if p.fs != nil {
		cp.dir = p.dir + "-checkpoint"
	}
	require.NoError(t, db.Checkpoint(cp.dir))
	return func(opts receipts.Options) (*receipts.DB, error) { return s.open(t, cp, opts) }
}
