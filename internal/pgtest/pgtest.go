// Package pgtest gives tests a PostgreSQL server: the one named by RECEIPTS_PG_DSN, or else a
// throwaway cluster started from the installed server binaries, one per test binary.
//
// A test package uses it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// and each test asks for a fresh schema (Schema) or a fresh database (Database). The cluster
// starts on the first such call, so test binaries whose selected tests need no PostgreSQL pay
// nothing. On a machine without PostgreSQL the tests skip, with one line saying why; with
// CI=true they fail instead.
//
// The cluster itself is started by package pgcluster (the launcher, which programs use too and
// which links no testing package); Cluster, Config, Start, StartWith, FindBinDir, ErrNoServer
// and Leftovers forward to it. This package adds what needs a testing.TB: Main, Schema,
// Database, DSN, Restart, DataDir, BinDir, StartPair and LeakChecked.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// EnvDSN names the environment variable holding the DSN of an existing server to test
// against instead of a throwaway cluster. Tests create (and drop) their own schemas and
// databases in it.
const EnvDSN = "RECEIPTS_PG_DSN"

var (
	once     sync.Once
	baseDSN  string   // superuser DSN of the server the tests use
	cluster  *Cluster // nil with RECEIPTS_PG_DSN
	startErr error    // why there is no server
	skipOnce sync.Once
	// mainRan is set by Main: a package whose TestMain does not call it
	// would leave its cluster running, so server refuses it.
	mainRan bool
)

// M is what Main runs: a *testing.M, or a wrapper of one (a leak check around its Run).
type M interface{ Run() int }

// Main runs the package's tests (call it from TestMain) and stops the throwaway cluster, if
// one was started, when they are done.
func Main(m M) {
	mainRan = true
	code := m.Run()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

func setup() {
	if d := os.Getenv(EnvDSN); d != "" {
		baseDSN = d
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx)
	if errors.Is(err, ErrNoServer) {
		err = fmt.Errorf("%w; or set %s", err, EnvDSN)
	}
	if err != nil {
		startErr = err
		return
	}
	cluster, baseDSN = c, c.DSN
}

// server returns the server's superuser DSN, starting the cluster on the first call. Without a
// server it skips t (printing the reason once), or fails t when CI=true.
func server(t testing.TB) string {
	t.Helper()
	if !mainRan {
		t.Fatal("pgtest: the package's TestMain must call pgtest.Main(m) (or pgtest.Main(pgtest.LeakChecked(m))), which stops the cluster its tests start")
	}
	once.Do(setup)
	if startErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL tests must run in CI: %v", startErr)
		}
		skipOnce.Do(func() {
			fmt.Fprintf(os.Stderr, "pgtest: skipping PostgreSQL tests: %v\n", startErr)
		})
		t.Skip("no PostgreSQL server")
	}
	return baseDSN
}

// Available reports whether a server can be had (starting the cluster if needed), without
// skipping or failing.
func Available() bool {
	if !mainRan {
		panic("pgtest: the package's TestMain must call pgtest.Main(m), which stops the cluster its tests start")
	}
	once.Do(setup)
	return startErr == nil
}

func name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func withDatabase(dsn, db string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		// key=value form
		return dsn + " dbname=" + db, nil
	}
	u.Path = "/" + db
	return u.String(), nil
}

func execSQL(t testing.TB, dsn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// DSN returns the DSN of the test server's main database (shared by every test; use Schema
// or Database to keep tests apart).
func DSN(t testing.TB) string {
	t.Helper()
	return server(t)
}

// Schema returns the DSN of the server and the name of a fresh, empty schema that nothing else
// uses; the schema is dropped when t ends. Two engines opened on the same DSN and schema
// behave as two nodes sharing one database.
func Schema(t testing.TB) (dsn, schema string) {
	t.Helper()
	dsn = server(t)
	schema = name("t_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("pgtest: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return dsn, schema
}

// Database creates a fresh database and returns its DSN; it is dropped when t ends.
func Database(t testing.TB) string {
	t.Helper()
	dsn := server(t)
	db := name("t_")
	execSQL(t, dsn, "CREATE DATABASE "+db)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("pgtest: drop database %s: %v", db, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: drop database %s: %v", db, err)
		}
	})
	out, err := withDatabase(dsn, db)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ErrExternal is returned by Restart when the tests run against RECEIPTS_PG_DSN: a server the
// tests did not start is never restarted.
var ErrExternal = errors.New("pgtest: the server is external (RECEIPTS_PG_DSN); it cannot be restarted")

// Restart crashes and restarts the throwaway server (`pg_ctl restart -m immediate`). Every
// connection is cut. Tests that need it should skip on ErrExternal.
func Restart(t testing.TB) error {
	t.Helper()
	server(t)
	if cluster == nil {
		return ErrExternal
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return cluster.Restart(ctx)
}

// LeakChecked wraps m for Main: after the tests pass, it fails the run if a
// goroutine is still running (goleak.Find with opts), before Main stops the
// cluster. Use pgtest.Main(pgtest.LeakChecked(m)) where a package would call
// goleak.VerifyTestMain(m).
func LeakChecked(m *testing.M, opts ...goleak.Option) M { return leakChecked{m, opts} }

type leakChecked struct {
	m    *testing.M
	opts []goleak.Option
}

func (l leakChecked) Run() int {
	code := l.m.Run()
	if code == 0 {
		if err := goleak.Find(l.opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			return 1
		}
	}
	return code
}

// DataDir returns the throwaway cluster's data directory (its tables' pages and its WAL, in
// pg_wal), for tests that look at what the server wrote to disk: run CHECKPOINT first so that
// the pages are written. It skips t against RECEIPTS_PG_DSN (the files are not ours to read).
func DataDir(t testing.TB) string {
	t.Helper()
	server(t)
	if cluster == nil {
		t.Skip("pgtest: the server is external (RECEIPTS_PG_DSN): its data directory is not ours to read")
	}
	return cluster.DataDir()
}

// BinDir returns the directory of the server's binaries (pg_dump, pg_waldump, psql), of the
// throwaway cluster or found as FindBinDir finds it.
func BinDir(t testing.TB) string {
	t.Helper()
	server(t)
	if cluster != nil {
		return cluster.BinDir
	}
	d, err := FindBinDir()
	if err != nil {
		t.Skip(err)
	}
	return d
}
