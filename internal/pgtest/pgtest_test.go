package pgtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// The helper the child processes below run: it needs a server.
func TestChildNeedsServer(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "" {
		t.Skip("run by TestNoServer")
	}
	for i := 0; i < 3; i++ {
		t.Run("sub", func(t *testing.T) { DSN(t) })
	}
}

// Without PostgreSQL the tests skip with one line saying why; with CI=true they fail.
func TestNoServer(t *testing.T) {
	run := func(ci string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChildNeedsServer$", "-test.count=1")
		cmd.Env = append(os.Environ(), "PGTEST_CHILD=1", "PG_BINDIR=/nonexistent", EnvDSN+"=", "CI="+ci)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("")
	if err != nil {
		t.Fatalf("without a server and CI unset: %v\n%s", err, out)
	}
	if n := strings.Count(out, "pgtest: skipping PostgreSQL tests"); n != 1 {
		t.Fatalf("want one skip line, got %d:\n%s", n, out)
	}
	out, err = run("true")
	if err == nil || !strings.Contains(out, "PostgreSQL tests must run in CI") {
		t.Fatalf("with CI=true: err %v\n%s", err, out)
	}
}

func TestSchemaDatabaseRestart(t *testing.T) {
	dsn, schema := Schema(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	db := Database(t)
	conn, err = pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var name string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil || !strings.HasPrefix(name, "t_") {
		t.Fatalf("database %q %v", name, err)
	}
	if err := Restart(t); err == ErrExternal {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("connection survived an immediate restart")
	}
	c2, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	c2.Close(ctx)
}

// TestNoClusterLeftBehind fails if a test run left a throwaway cluster
// running. CI runs it after `go test ./...` (RECEIPTS_PGTEST_LEFTOVERS=1):
// a package whose TestMain did not stop its cluster shows here.
func TestNoClusterLeftBehind(t *testing.T) {
	if os.Getenv("RECEIPTS_PGTEST_LEFTOVERS") != "1" {
		t.Skip("run after the other tests, with RECEIPTS_PGTEST_LEFTOVERS=1 (.ci/run does)")
	}
	l, err := Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	if len(l) > 0 {
		t.Fatalf("test runs left %d PostgreSQL clusters behind:\n%s", len(l), strings.Join(l, "\n"))
	}
}
