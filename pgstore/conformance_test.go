package pgstore

import (
	"context"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/receiptstest"
)

// TestConformance runs the contract kit (package receiptstest) on PostgreSQL: each store is
// a fresh schema on the test server (internal/pgtest), opened on a pool the suite shares, as
// the nodes of a service share theirs; a reopen is a new pool and pgstore.Open on the same
// schema, as a restarted node would do. (A new pool for every store connected afresh each
// time: the close-race test alone, 30 stores of 40-odd connections, spent most of a minute
// starting backends on a 2-vCPU machine.)
//
//	go test -run 'TestConformance/Lease/' ./pgstore
//
// Its runtime is mostly Isolation/Scopes (300 random checks by default, each a few hundred
// statements and a new partition, 50–90 s here): it runs 100 (one rapid batch, the fewest it
// runs) unless RECEIPTSTEST_ISOLATION_CHECKS says otherwise or RECEIPTS_SOAK=1 (the kit's
// 300; TestMain sets it). The Pebble run of the kit keeps its 300.
//
// It runs in parallel with the package's other parallel tests (those that share nothing with
// it but the server: clusters of their own, schemas of their own, no leak check), after the
// sequential ones: most of their time is waiting on the server, and the package's run is the
// longest of CI's test and race runs.
func TestConformance(t *testing.T) {
	pgtest.DSN(t) // skips (or, with CI=true, fails) without a server
	t.Parallel()
	s := &pgStore{}
	t.Cleanup(s.close) // after every subtest's own cleanups
	receiptstest.Run(t, s)
}

// TestFrontEnds runs the kit's front-end suites (receiptstest.RunHTTP, RunMCP) on PostgreSQL
// with two nodes: two pgstore.Open on one schema, each with a pool of its own, each serving
// its own server.
//
//	go test -run 'TestFrontEnds/HTTP/' ./pgstore
func TestFrontEnds(t *testing.T) {
	pgtest.DSN(t)
	t.Parallel()
	s := &pgStore{}
	t.Cleanup(s.close)
	t.Run("HTTP", func(t *testing.T) { receiptstest.RunHTTP(t, s) })
	t.Run("MCP", func(t *testing.T) { receiptstest.RunMCP(t, s) })
}

// pgStore is receiptstest.Store on PostgreSQL.
type pgStore struct {
	mu      sync.Mutex
	shared  *pgxpool.Pool           // protected by mu: fresh stores' pool, made by the first Open
	schemas map[*receipts.DB]opened // protected by mu
}

// opened is a store this Store opened: where, and on which pool (own: made by a Reopen,
// closed with the store).
type opened struct {
	place
	pool *pgxpool.Pool
	own  bool
}

type place struct{ dsn, schema string }

// Resolution implements receiptstest.Resolution: timestamptz keeps microseconds.
func (s *pgStore) Resolution() time.Duration { return time.Microsecond }

func (s *pgStore) Open(t testing.TB, opts receipts.Options) (*receipts.DB, error) {
	dsn, schema := pgtest.Schema(t)
	s.mu.Lock()
	if s.shared == nil {
		s.shared = newTestPool(t, dsn)
	}
	pool := s.shared
	s.mu.Unlock()
	return s.open(t, opened{place{dsn, schema}, pool, false}, opts)
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
	if o.own {
		o.pool.Close() // its connections go now, not when t ends (tests that reopen many times)
	}
	return s.open(t, opened{o.place, newTestPool(t, o.dsn), true}, opts)
}

// OpenNode implements receiptstest.Nodes: pgstore.Open on db's schema with a pool of its
// own, as another node of the service would.
func (s *pgStore) OpenNode(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	o, ok := s.schemas[db]
	s.mu.Unlock()
	if !ok {
		t.Fatalf("OpenNode on a store this Store did not open")
	}
	return s.open(t, opened{o.place, newTestPool(t, o.dsn), true}, opts)
}

// effectsTable is where the kit's effects write, in the store's schema.
func (s *pgStore) effectsTable(t testing.TB, db *receipts.DB) (*pgxpool.Pool, string) {
	s.mu.Lock()
	o, ok := s.schemas[db]
	s.mu.Unlock()
	if !ok {
		t.Fatalf("effects on a store this Store did not open")
	}
	return o.pool, pgx.Identifier{o.schema, "receiptstest_effects"}.Sanitize()
}

// Effect implements receiptstest.Effects: a row inserted in the transaction that holds the
// lease (pgx.Tx), in a table of the store's schema.
func (s *pgStore) Effect(t testing.TB, db *receipts.DB, name string) receipts.Effect {
	pool, tbl := s.effectsTable(t, db)
	if _, err := pool.Exec(bg, `CREATE TABLE IF NOT EXISTS `+tbl+` (name text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return receipts.EffectOn(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+tbl+` (name) VALUES ($1)`, name)
		return err
	})
}

// HasEffect implements receiptstest.Effects.
func (s *pgStore) HasEffect(t testing.TB, db *receipts.DB, name string) bool {
	pool, tbl := s.effectsTable(t, db)
	var n int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM `+tbl+` WHERE name = $1`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func (s *pgStore) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared != nil {
		s.shared.Close()
	}
}

func newTestPool(t testing.TB, dsn string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

func (s *pgStore) open(t testing.TB, o opened, opts receipts.Options) (*receipts.DB, error) {
	db, err := Open(bg, o.pool, &Options{Options: opts, Schema: o.schema})
	if err != nil {
		if o.own {
			o.pool.Close()
		}
		return nil, err
	}
	s.mu.Lock()
	if s.schemas == nil {
		s.schemas = map[*receipts.DB]opened{}
	}
	s.schemas[db] = o
	s.mu.Unlock()
	t.Cleanup(func() {
		_ = db.Close()
		if o.own {
			o.pool.Close()
		}
	})
	return db, nil
}

// Backup takes a pg_dump of the store's schema (receiptstest.Backup); the copy is restored
// into a database of its own, under the same schema name.
func (s *pgStore) Backup(t testing.TB, db *receipts.DB) func(opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	o := s.schemas[db]
	s.mu.Unlock()
	dump := pgDump(t, o.dsn, o.schema)
	return func(opts receipts.Options) (*receipts.DB, error) {
		dsn := pgRestore(t, dump)
		return s.open(t, opened{place{dsn, o.schema}, newTestPool(t, dsn), true}, opts)
	}
}

// pgDump dumps schema (tables and data) with pg_dump into a file, and returns its path.
func pgDump(t testing.TB, dsn, schema string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "dump.sql")
	cmd := exec.Command(filepath.Join(pgtest.BinDir(t), "pg_dump"), "--schema="+schema, "--no-owner", "--file="+out, "--dbname="+dsn)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, b)
	}
	return out
}

// pgRestore loads a dump into a new database and returns its DSN.
func pgRestore(t testing.TB, dump string) string {
	t.Helper()
	dsn := pgtest.Database(t)
	cmd := exec.Command(filepath.Join(pgtest.BinDir(t), "psql"), "--quiet", "--set=ON_ERROR_STOP=1", "--file="+dump, "--dbname="+dsn)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("psql (restore): %v\n%s", err, b)
	}
	return dsn
}
