package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pgstore"
)

// defaultSchema is --schema's default: pgstore's.
const defaultSchema = "receipts"

// pgStore is a store on PostgreSQL that receiptctl opened: the DB and the
// pool it runs on (which Close closes too).
type pgStore struct {
	db   *receipts.DB
	pool *pgxpool.Pool
}

func (s *pgStore) close() error {
	err := s.db.Close()
	s.pool.Close()
	return err
}

// describeDSN names the server of dsn without its password, for messages.
func describeDSN(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "the --pg server"
	}
	return fmt.Sprintf("%s@%s/%s", cfg.User, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), cfg.Database)
}

// openPGPool connects to dsn with a small pool (receiptctl runs one command).
func openPGPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usagef("--pg: %v", err)
	}
	cfg.MaxConns = 4
	pgstore.Configure(cfg) // a COMMIT the standby never confirmed is not reported durable
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, cfg)
	if err == nil {
		err = pool.Ping(cctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cannot connect to PostgreSQL at %s: %w", describeDSN(dsn), err)
	}
	return pool, nil
}

// hasPGStore reports whether schema in pool's database holds a receipts store
// (its meta table), so that receiptctl never creates one where there was none.
func hasPGStore(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	var exists bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'meta')`, schema).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("look for schema %s: %w", schema, err)
	}
	return exists, nil
}

// openPG opens the store in --schema of --pg's database: no background GC,
// poll-only (receiptctl waits for nobody), warnings to stderr, with the
// retention the store records (see retentionFlags). needKnown is gc's: there
// --override-retention is used (and recorded, as on a directory). The read
// commands refuse --override-retention on PostgreSQL: opening a schema with
// another retention records it there, under the running service's nodes.
func (a *app) openPG(ctx context.Context, gc bool) (*pgStore, retentionSource, error) {
	if err := a.settings.check(); err != nil {
		return nil, 0, err
	}
	if a.settings.override != 0 && !gc {
		return nil, 0, usagef("--override-retention works on PostgreSQL for gc only: opening the schema with another retention records it for every node of the service")
	}
	pool, err := openPGPool(ctx, a.pg)
	if err != nil {
		return nil, 0, err
	}
	s, src, err := openPGOn(ctx, pool, a.schema, a.settings, a.stderr)
	if err != nil {
		pool.Close()
		return nil, 0, err
	}
	return s, src, nil
}

func openPGOn(ctx context.Context, pool *pgxpool.Pool, schema string, f retentionFlags, stderr io.Writer) (*pgStore, retentionSource, error) {
	ok, err := hasPGStore(ctx, pool, schema)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		return nil, 0, fmt.Errorf("no store in schema %q of that database (give the service's schema with --schema)", schema)
	}
	open := func(retention, ttl time.Duration) (*receipts.DB, error) {
		db, err := pgstore.Open(ctx, pool, &pgstore.Options{
			Options: receipts.Options{Retention: retention, LeaseTTL: ttl, GCInterval: -1, Logger: newLogger(stderr), Keyring: f.keyring},
			Schema:  schema,
		})
		if err != nil {
			return nil, fmt.Errorf("open schema %s: %w", schema, err)
		}
		return db, nil
	}
	db, err := open(0, 0) // the recorded settings
	if err != nil {
		return nil, 0, err
	}
	o := db.Options()
	retention, ttl, src, err := f.resolve(o.Retention, o.LeaseTTL, true, stderr)
	if err == nil && retention != 0 {
		if err = db.Close(); err == nil {
			db, err = open(retention, ttl)
		}
		if err != nil {
			return nil, 0, err
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, 0, err
	}
	return &pgStore{db: db, pool: pool}, src, nil
}

// maintUntil reads when the schema's maintenance lease runs out (zero if no
// node holds one). pgstore runs GC under that lease, one node at a time: a
// pass that finds another holder's lease unexpired does nothing.
func (s *pgStore) maintUntil(ctx context.Context, schema string) (time.Time, error) {
	var until *time.Time
	err := s.pool.QueryRow(ctx, `SELECT maint_until FROM `+pgx.Identifier{schema}.Sanitize()+`.meta`).Scan(&until)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the maintenance lease: %w", err)
	}
	if until == nil {
		return time.Time{}, nil
	}
	return *until, nil
}

// gcPG runs one GC pass on the store in --schema, and reports a pass that
// did nothing because another node (or an earlier gc) holds the
// maintenance lease.
func (a *app) gcPG(ctx context.Context) (receipts.GCStats, error) {
	s, _, err := a.openPG(ctx, true)
	if err != nil {
		return receipts.GCStats{}, err
	}
	before, err := s.maintUntil(ctx, a.schema)
	if err != nil {
		_ = s.close()
		return receipts.GCStats{}, err
	}
	st, gcErr := s.db.GC(ctx)
	var after time.Time
	if gcErr == nil {
		after, gcErr = s.maintUntil(ctx, a.schema)
	}
	if err := s.close(); gcErr == nil {
		gcErr = err
	}
	if gcErr != nil {
		return st, gcErr
	}
	if !before.IsZero() && after.Equal(before) && st.At.Before(before) {
		return st, fmt.Errorf(`gc did nothing: another node holds the schema's maintenance lease until %s
(a service node whose GC runs, or an earlier receiptctl gc; one node at a time drops partitions).
The holder carries on; to run gc here, try again after that`, showTime(before))
	}
	return st, nil
}

// verifyPG checks a store on PostgreSQL: it opens (which checks the schema's
// format and meta) and prints DB.Check (meta, token sequence, every row and
// partition).
func (a *app) verifyPG(ctx context.Context) error {
	s, _, err := a.openPG(ctx, false)
	switch {
	case errors.Is(err, receipts.ErrCorrupt), errors.Is(err, receipts.ErrUnknownFormat):
		rep := &verifyReport{Dir: describeDSN(a.pg) + " schema " + a.schema, Problems: []verifyProblem{{Key: "store", Problem: err.Error()}}}
		return a.finishVerify(rep)
	case err != nil:
		return err
	}
	defer s.close()
	rep := &verifyReport{Dir: describeDSN(a.pg) + " schema " + a.schema, Problems: []verifyProblem{}}
	if err := a.verify(ctx, s.db, rep); err != nil {
		return err
	}
	return a.finishVerify(rep)
}

// finishVerify prints rep and returns errProblems if it found any.
func (a *app) finishVerify(rep *verifyReport) error {
	rep.OK = len(rep.Problems) == 0
	if a.json {
		if err := writeJSON(a.stdout, rep); err != nil {
			return err
		}
	} else {
		a.printVerify(rep)
	}
	if !rep.OK {
		return errProblems
	}
	return nil
}
