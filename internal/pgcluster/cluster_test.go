package pgcluster

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
