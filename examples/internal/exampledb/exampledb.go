// Package exampledb opens the receipts store of an example: Pebble in a
// directory (the default), or PostgreSQL with -pg: -pg DSN names a server,
// and -pg alone starts a throwaway cluster from the installed server
// binaries (as receiptctl demo --pg does), whose DSN the example prints so
// that a second instance can share it.
//
// In a program built with -tags receipts_nopebble (a PostgreSQL-only build,
// which links no Pebble: docs/postgresql.md) the Pebble default fails with
// receipts.ErrUnsupported, and -pg is the way to run.
package exampledb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgcluster"
	"github.com/receiptstore/receipts/pgstore"
)

// Auto is the value of the -pg flag given alone: start a throwaway cluster.
const Auto = "auto"

// PGFlag is the -pg flag (a flag.Value): "" (Pebble), a DSN, or Auto.
type PGFlag string

// String implements flag.Value.
func (f *PGFlag) String() string { return string(*f) }

// Set implements flag.Value: -pg alone sets Auto.
func (f *PGFlag) Set(s string) error {
	if s == "true" {
		s = Auto
	}
	*f = PGFlag(s)
	return nil
}

// IsBoolFlag lets -pg stand alone.
func (f *PGFlag) IsBoolFlag() bool { return true }

// Args rewrites "-pg DSN" as "-pg=DSN" in a command line, so that a DSN
// after -pg is its value and the flags after it are still parsed. (A
// value of the flag given alone cannot start with "-".)
func Args(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if (a == "-pg" || a == "--pg") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// Config says which store to open.
type Config struct {
	Dir     string           // Pebble's directory, without PG
	PG      string           // a DSN, Auto, or "" for Pebble
	Schema  string           // PostgreSQL's schema (default "receipts")
	Options receipts.Options // the store's options
	Log     *slog.Logger     // where a throwaway cluster's DSN is told
}

// Store is an example's store.
type Store struct {
	DB     *receipts.DB
	Pool   *pgxpool.Pool // the PostgreSQL pool; nil on Pebble
	DSN    string        // the PostgreSQL database ("" on Pebble)
	Schema string        // the PostgreSQL schema
	stop   func() error  // stops a throwaway cluster
}

// ErrNoServer is returned by Open for -pg alone on a machine without the
// PostgreSQL server binaries.
var ErrNoServer = errors.New("-pg without a DSN starts a throwaway PostgreSQL cluster, but no server binaries were found (Debian: apt-get install postgresql; or set PG_BINDIR); or give a server: -pg postgres://user@host/db")

// Open opens the store cfg names.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.PG == "" {
		db, err := receipts.Open(cfg.Dir, &cfg.Options)
		if errors.Is(err, receipts.ErrUnsupported) {
			return nil, fmt.Errorf("%w\nthis build keeps its store on PostgreSQL only: give -pg DSN, or -pg alone for a throwaway cluster", err)
		}
		if err != nil {
			return nil, err
		}
		return &Store{DB: db}, nil
	}
	s := &Store{DSN: cfg.PG, Schema: cfg.Schema}
	if s.Schema == "" {
		s.Schema = "receipts"
	}
	if cfg.PG == Auto {
		c, err := pgcluster.Start(ctx)
		switch {
		case errors.Is(err, pgcluster.ErrNoServer):
			return nil, ErrNoServer
		case err != nil:
			return nil, fmt.Errorf("start a throwaway PostgreSQL cluster: %w", err)
		}
		s.DSN, s.stop = c.DSN, c.Stop
		if cfg.Log != nil {
			cfg.Log.Info("started a throwaway PostgreSQL cluster; it is removed at exit; a second instance can share it with -pg", "dsn", c.DSN)
		}
	}
	pcfg, err := pgxpool.ParseConfig(s.DSN)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("PostgreSQL DSN: %w", err), s.Close())
	}
	pgstore.Configure(pcfg) // a COMMIT the standby never confirmed is not reported durable
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("connect to PostgreSQL: %w", err), s.Close())
	}
	s.Pool = pool
	dsn := s.DSN
	s.DB, err = pgstore.Open(ctx, pool, &pgstore.Options{
		Options: cfg.Options,
		Schema:  s.Schema,
		// A waiter on this instance wakes when another instance commits.
		ListenConn: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) },
	})
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// CreateObjects runs stmts, each a CREATE … IF NOT EXISTS of an example's
// own tables or sequences in schema, in one transaction that first takes a
// transaction-scoped advisory lock named after schema, as pgstore.Open does
// for its own objects: replicas that start at the same moment on an empty
// database take turns, and each later one finds the objects there. Without
// the lock, concurrent CREATE TABLE IF NOT EXISTS is not safe in PostgreSQL:
// two transactions both find the table absent, and one fails with a
// duplicate key on pg_type_typname_nsp_index (or "type … already exists").
// The lock is transaction-scoped, so it works through a transaction pooler.
func CreateObjects(ctx context.Context, pool *pgxpool.Pool, schema string, stmts ...string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "receipts examples: "+schema); err != nil {
			return err
		}
		for _, stmt := range stmts {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close closes the store (if DB.Close has not already), its pool, and a
// throwaway cluster.
func (s *Store) Close() error {
	var errs []error
	if s.DB != nil {
		errs = append(errs, s.DB.Close())
	}
	if s.Pool != nil {
		s.Pool.Close()
	}
	if s.stop != nil {
		errs = append(errs, s.stop())
	}
	return errors.Join(errs...)
}

// StartAtOnce opens replicas stores on dsn's schema at the same moment, each with its own
// pool, as a service started that many times on an empty database would, and once every one
// is open runs create (the service's own objects, through CreateObjects) on all of them at
// once. It returns each replica's failure: none, since CreateObjects serializes the
// creation. The examples' tests of replicas that start at once (issue 43, item 4) use it.
func StartAtOnce(dsn, schema string, replicas int, create func(ctx context.Context, s *Store) error) []error {
	ctx := context.Background()
	var opened, wg sync.WaitGroup
	opened.Add(replicas)
	errs := make(chan error, replicas)
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			store, err := Open(ctx, Config{PG: dsn, Schema: schema, Options: receipts.Options{GCInterval: -1}})
			opened.Done()
			if err != nil {
				errs <- fmt.Errorf("replica %d: open: %w", i, err)
				return
			}
			defer store.Close()
			opened.Wait() // every replica's store is open: they create their objects at once
			if err := create(ctx, store); err != nil {
				errs <- fmt.Errorf("replica %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}
