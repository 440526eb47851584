package pgtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// A cluster whose test binary is gone (killed: it never ran Stop) is stopped and removed by
// the next cluster's start; one whose owner is alive is left alone.
func TestStartReapsOrphans(t *testing.T) {
	if _, err := FindBinDir(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	orphan, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer orphan.Stop() // if the reaper failed
	live, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Stop()
	// The orphan's owner: a process that has exited.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan.Dir, ownerFile), []byte(strconv.Itoa(gone.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	third, err := Start(ctx) // its start reaps
	if err != nil {
		t.Fatal(err)
	}
	defer third.Stop()
	if _, err := os.Stat(orphan.Dir); !os.IsNotExist(err) {
		t.Fatalf("the orphan's directory is still there: %v", err)
	}
	if conn, err := pgx.Connect(ctx, orphan.DSN); err == nil {
		conn.Close(ctx)
		t.Fatal("the orphan's server still accepts connections")
	}
	conn, err := pgx.Connect(ctx, live.DSN)
	if err != nil {
		t.Fatalf("a cluster whose owner is alive was reaped: %v", err)
	}
	conn.Close(ctx)
}

// Leftovers names a cluster whose test binary has exited, both its
// directory and its server, and not one whose owner is alive.
func TestLeftovers(t *testing.T) {
	if _, err := FindBinDir(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	c, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	mine := func() []string {
		all, err := Leftovers()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range all {
			if strings.Contains(l, c.Dir) {
				out = append(out, l)
			}
		}
		return out
	}
	if l := mine(); len(l) != 0 {
		t.Fatalf("a cluster whose owner is alive is listed: %q", l)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, ownerFile), []byte(strconv.Itoa(gone.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	l := mine()
	if len(l) != 2 || !strings.HasPrefix(l[0], "cluster directory") || !strings.HasPrefix(l[1], "server process") {
		t.Fatalf("leftovers of an orphaned cluster = %q, want its directory and its server", l)
	}
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
