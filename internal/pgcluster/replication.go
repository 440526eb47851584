package pgcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Streaming replication: a standby of a cluster, and the moves of a failover (kill the
// primary, promote the standby, stop and start a server). internal/pgtest's Pair puts a
// primary and a standby together for one test.

// DSNFor is c's superuser DSN for database db.
func (c *Cluster) DSNFor(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// StartStandby makes a streaming standby of c named name: a base backup of c (pg_basebackup,
// its WAL streamed), started on a port of its own, streaming from c under application_name
// name. It returns once c lists it in pg_stat_replication. Its settings are c's as of the
// backup (postgresql.auto.conf included): set c's synchronous_standby_names after it.
func (c *Cluster) StartStandby(ctx context.Context, name string) (*Cluster, error) {
	return c.StartStandbyOn(ctx, name, 0, "")
}

// StartStandbyOn is StartStandby on port (0: a free one), streaming from upstream (host:port;
// "": c itself), say a proxy in front of c that delays the WAL as a remote site's link would.
// A failover harness puts the new standby of a promoted primary on the port of the primary it
// killed, so that one multi-host DSN names both servers through any number of failovers.
func (c *Cluster) StartStandbyOn(ctx context.Context, name string, port int, upstream string) (*Cluster, error) {
	upHost, upPort := "127.0.0.1", strconv.Itoa(c.Port)
	if upstream != "" {
		var err error
		if upHost, upPort, err = net.SplitHostPort(upstream); err != nil {
			return nil, fmt.Errorf("pgcluster: standby upstream %q: %w", upstream, err)
		}
	}
	dir, err := os.MkdirTemp("", clusterPrefix)
	if err != nil {
		return nil, err
	}
	s := &Cluster{Dir: dir, BinDir: c.BinDir, runAs: c.runAs, cfg: c.cfg}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		s.remove()
		return nil, err
	}
	if c.runAs != "" {
		if err := chownTo(dir, c.runAs); err != nil {
			s.remove()
			return nil, err
		}
	}
	if out, err := s.run(ctx, "pg_basebackup", "-D", s.data(), "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-X", "stream", "-R", "--no-sync", "--checkpoint=fast"); err != nil {
		s.remove()
		return nil, fmt.Errorf("pgcluster: pg_basebackup: %w\n%s", err, out)
	}
	s.Port = port
	if port == 0 {
		if s.Port, err = freePort(); err != nil {
			s.remove()
			return nil, err
		}
	}
	// On the command line, primary_conninfo takes precedence over the one -R wrote.
	s.extra = fmt.Sprintf(" -c primary_conninfo='host=%s port=%s user=postgres application_name=%s'", upHost, upPort, name)
	if err := s.start(ctx); err != nil {
		s.remove()
		return nil, err
	}
	s.DSN = s.DSNFor("postgres")
	if err := c.WaitStandby(ctx, name, ""); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// SetSynchronous sets c's synchronous_standby_names (ALTER SYSTEM, then a reload): a standby's
// name, or a list ("ANY 1 (a, b)"); "" makes replication asynchronous again (commits waiting
// for a standby are released).
func (c *Cluster) SetSynchronous(ctx context.Context, names string) error {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(names)); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

// WaitStandby waits until c's pg_stat_replication lists the standby name streaming, with
// sync_state syncState if it is not "" ("sync", "async", "quorum").
func (c *Cluster) WaitStandby(ctx context.Context, name, syncState string) error {
	var last error
	for {
		conn, err := pgx.Connect(ctx, c.DSN)
		if err == nil {
			var state string
			err = conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, name).Scan(&state)
			_ = conn.Close(ctx)
			if err == nil && (syncState == "" || state == syncState) {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("sync_state %s", state)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: standby %s not streaming (%s): %w", name, syncState, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kill SIGKILLs c's postmaster: no shutdown, its backends exit as they notice, and the data
// directory is as after a crash of the machine's PostgreSQL (what a failover manager's
// fencing or a dead host leaves).
func (c *Cluster) Kill() error {
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pgcluster: kill: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return fmt.Errorf("pgcluster: kill: postmaster.pid: %q", first)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgcluster: kill %d: %w", pid, err)
	}
	for processAlive(pid) { // a zombie until its parent reaps it; pg_ctl's parent is init
		time.Sleep(5 * time.Millisecond)
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(b), ") Z ") {
			break
		}
	}
	return nil
}

// Promote promotes c, a standby, to a primary (pg_ctl promote, waiting until it accepts
// writes).
func (c *Cluster) Promote(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// Shutdown stops c's server (pg_ctl stop -m fast) and keeps its files: Start starts it again.
func (c *Cluster) Shutdown(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Start starts c's server again after Shutdown.
func (c *Cluster) Start(ctx context.Context) error { return c.start(ctx) }

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
