package receipts_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// testStore is a DB on an in-memory FS with a fake clock, reopenable.
type testStore struct {
	t     testing.TB
	fs    vfs.FS
	dir   string
	clock *receiptstest.Clock
	opts  pebblestore.Options
	db    *receipts.DB
}

// noTombstones turns tombstones off, for tests of what happens right after
// retention.
func noTombstones(o *pebblestore.Options) { o.TombstoneWindow = -1 }

func newTestStore(t testing.TB, mod func(*pebblestore.Options)) *testStore {
	t.Helper()
	s := &testStore{t: t, fs: vfs.NewMem(), dir: "db", clock: receiptstest.NewClock(receiptstest.DefaultStart)}
	s.opts = pebblestore.Options{Options: receipts.Options{
		Retention:  time.Hour,
		LeaseTTL:   30 * time.Second,
		GCInterval: -1,
		Now:        s.clock.Now,
	}}
	if mod != nil {
		mod(&s.opts)
	}
	s.open()
	t.Cleanup(func() {
		if s.db != nil {
			require.NoError(t, s.db.Close())
		}
	})
	return s
}

func (s *testStore) open() {
	s.t.Helper()
	o := s.opts
	po := &pebble.Options{}
	if o.Pebble != nil {
		po = o.Pebble.Clone()
	}
	po.FS = s.fs
	o.Pebble = po
	db, err := pebblestore.Open(s.dir, &o)
	require.NoError(s.t, err)
	s.db = db
}

func (s *testStore) reopen() {
	s.t.Helper()
	require.NoError(s.t, s.db.Close())
	s.db = nil
	s.open()
}

var bg = context.Background()

func key(scope, id string) receipts.Key { return receipts.Key{Scope: scope, ID: id} }

// countOf is db.Count, which must not fail.
func countOf(t testing.TB, db *receipts.DB) receipts.Counts {
	t.Helper()
	c, err := db.Count(context.Background())
	require.NoError(t, err, "Count")
	return c
}
