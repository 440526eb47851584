package pgstore

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/receiptstest"
)

// TestConformance runs the contract kit (package receiptstest) on PostgreSQL: each store is
// a fresh schema on the test server (internal/pgtest), and a reopen is a new pool and
// pgstore.Open on the same schema, as a restarted node would do.
//
//	go test -run 'TestConformance/Lease/' ./pgstore
//
// Its runtime is mostly Isolation/Scopes (300 random checks, each a few hundred statements):
// under the race detector, which CI also runs this package with, it runs 100 (one rapid
// batch, the fewest it runs) unless RECEIPTSTEST_ISOLATION_CHECKS says otherwise.
func TestConformance(t *testing.T) {
	pgtest.DSN(t) // skips (or, with CI=true, fails) without a server
	if raceEnabled && os.Getenv("RECEIPTSTEST_ISOLATION_CHECKS") == "" {
		t.Setenv("RECEIPTSTEST_ISOLATION_CHECKS", "100")
	}
	receiptstest.Run(t, &pgStore{})
}

// pgStore is receiptstest.Store on PostgreSQL.
type pgStore struct {
	mu      sync.Mutex
	schemas map[*receipts.DB]opened // protected by mu
}

// opened is a store this Store opened: where, and on which pool.
type opened struct {
	place
	pool *pgxpool.Pool
}

type place struct{ dsn, schema string }

// Resolution implements receiptstest.Resolution: timestamptz keeps microseconds.
func (s *pgStore) Resolution() time.Duration { return time.Microsecond }

func (s *pgStore) Open(t testing.TB, opts receipts.Options) (*receipts.DB, error) {
	dsn, schema := pgtest.Schema(t)
	return s.open(t, place{dsn, schema}, opts)
}

func (s *pgStore) Reopen(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	o, ok := s.schemas[db]
	s.mu.Unlock()
	if !ok {
		t.Fatalf("Reopen of a store this Store did not open")
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	o.pool.Close() // its connections go now, not when t ends (tests that reopen many times)
	return s.open(t, o.place, opts)
}

func (s *pgStore) open(t testing.TB, p place, opts receipts.Options) (*receipts.DB, error) {
	cfg, err := pgxpool.ParseConfig(p.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(bg, pool, &Options{Options: opts, Schema: p.schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.mu.Lock()
	if s.schemas == nil {
		s.schemas = map[*receipts.DB]opened{}
	}
	s.schemas[db] = opened{p, pool}
	s.mu.Unlock()
	t.Cleanup(func() {
		_ = db.Close()
		pool.Close()
	})
	return db, nil
}
