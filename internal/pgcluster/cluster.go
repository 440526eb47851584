// Package pgcluster starts a throwaway PostgreSQL cluster from the installed server binaries:
// initdb into a temporary directory, a server on 127.0.0.1 at a free port, and Stop to shut it
// down and remove every file. Streaming standbys of a cluster (StartStandby) and the moves of a
// failover (Kill, Promote, Shutdown, Start) are here too.
//
// It is the launcher alone, for programs as well as tests: receiptctl demo --pg and the
// examples' -pg start their throwaway cluster with it, so it imports neither package testing
// nor any test library (the shipped CLI must not link them). Tests get a server through
// internal/pgtest, which is built on this package: one cluster per test binary, started on
// first use, or the server RECEIPTS_PG_DSN names.
//
// The cluster code (Start, StartWith, Stop, Restart) was adapted from bench/internal/pgtemp,
// which is now a user of it (StartWith(ctx, Config{Durable: true}) is pgtemp.Start). PostgreSQL
// refuses to run as root: when the process is root, the cluster's directory is given to the
// "postgres" system user (which Debian's postgresql package creates) and initdb, pg_ctl and
// the server run as that user through runuser(1).
//
// A cluster's directory records the process that started it. Start stops and removes the
// clusters whose owner is gone (a killed test binary never ran Stop), and Leftovers lists them.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrNoServer means no PostgreSQL server binaries were found.
var ErrNoServer = errors.New("pgcluster: no PostgreSQL server binaries (initdb, pg_ctl) found; install them (Debian: apt-get install postgresql) or set PG_BINDIR")

// Cluster is a running throwaway cluster.
type Cluster struct {
	DSN    string // superuser DSN of the "postgres" database
	Dir    string
	BinDir string
	Port   int
	runAs  string // "" = as this process
	cfg    Config
	extra  string // more server options (a standby's primary_conninfo)
}

// Config tunes a cluster.
type Config struct {
	// Durable keeps fsync on (benchmarks: numbers worth quoting need it). Off by default for
	// tests, which crash the server process, never the machine.
	Durable bool
}

// FindBinDir returns the directory holding initdb and pg_ctl: $PG_BINDIR if set, the newest
// /usr/lib/postgresql/*/bin, `pg_config --bindir`, or the PATH.
func FindBinDir() (string, error) {
	has := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "initdb"))
		return err == nil
	}
	if d := os.Getenv("PG_BINDIR"); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("%w (PG_BINDIR=%s has no initdb)", ErrNoServer, d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); d != "" && has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNoServer
}

func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// Start creates and starts a test cluster (StartWith with the zero Config). Call Stop when
// done, also on error paths.
//
// The cluster runs with fsync = off: tests crash the server process (Restart), never the
// machine, and a process crash loses nothing the kernel already has. Everything else keeps
// PostgreSQL's defaults (synchronous_commit = on, full_page_writes = on).
func Start(ctx context.Context) (*Cluster, error) { return StartWith(ctx, Config{}) }

// StartWith creates and starts a cluster configured by cfg.
func StartWith(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	reapOrphans(bin)
	dir, err := os.MkdirTemp("", clusterPrefix)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, BinDir: bin, cfg: cfg}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		c.remove()
		return nil, err
	}
	if os.Geteuid() == 0 {
		if err := chownTo(dir, "postgres"); err != nil {
			c.remove()
			return nil, err
		}
		c.runAs = "postgres"
	}
	if out, err := c.run(ctx, "initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		c.remove()
		return nil, fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
	}
	if c.Port, err = freePort(); err != nil {
		c.remove()
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		c.remove()
		return nil, err
	}
	c.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
	return c, nil
}

func (c *Cluster) data() string { return filepath.Join(c.Dir, "data") }

// DataDir returns c's data directory (its tables' pages and its WAL, in pg_wal).
func (c *Cluster) DataDir() string { return c.data() }

// chownTo gives dir to the system user name (the server runs as it when the tests run as root).
func chownTo(dir, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("pgcluster: running as root needs the %s system user: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

func (c *Cluster) opts() string {
	fsync := "off"
	if c.cfg.Durable {
		fsync = "on"
	}
	return fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=200 -c fsync=%s", c.Port, c.Dir, fsync) + c.extra
}

func (c *Cluster) start(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-l", filepath.Join(c.Dir, "server.log"), "-o", c.opts(), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.Dir, "server.log"))
		return fmt.Errorf("pgcluster: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return nil
}

// Restart crashes the server (`pg_ctl restart -m immediate`: no shutdown checkpoint, every
// connection cut, crash recovery on start) and waits until it accepts connections again.
func (c *Cluster) Restart(ctx context.Context) error {
	out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-l", filepath.Join(c.Dir, "server.log"), "-o", c.opts(), "-m", "immediate", "-w", "-t", "60", "restart")
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl restart: %w\n%s", err, out)
	}
	return nil
}

// Stop shuts the server down and removes the cluster's files.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-m", "fast", "-w", "stop")
	if err != nil {
		err = fmt.Errorf("pgcluster: pg_ctl stop: %w\n%s", err, out)
	}
	return errors.Join(err, c.remove())
}

func (c *Cluster) remove() error { return os.RemoveAll(c.Dir) }

// clusterPrefix names the clusters' directories (under os.TempDir); ownerFile, in each, holds
// the process ID of the program (a test binary, receiptctl demo) that started it. The prefix
// keeps its old name, so that clusters left by versions before the split are still found.
const (
	clusterPrefix = "receipts-pgtest-"
	ownerFile     = "owner.pid"
)

// reapOrphans stops and removes the clusters whose test binary is gone: one killed, or ended
// by a test timeout's panic, never ran Stop, and its server would run on, holding its memory
// and port, until the machine restarts. A cluster whose owner is alive (another package's
// tests running at the same time), or that names no owner (being set up, or made by an older
// version), is left alone.
func reapOrphans(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), clusterPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		c := &Cluster{Dir: dir, BinDir: bin}
		if os.Geteuid() == 0 {
			c.runAs = "postgres"
		}
		if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, _ = c.run(ctx, "pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
			cancel()
		}
		_ = c.remove()
	}
}

func (c *Cluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	path := filepath.Join(c.BinDir, prog)
	var cmd *exec.Cmd
	if c.runAs != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.Dir
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return bytes.TrimSpace(out.Bytes()), err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	_, p, _ := strings.Cut(l.Addr().String(), ":")
	return strconv.Atoi(p)
}

// Leftovers lists the throwaway clusters left behind by test binaries that
// are gone: a cluster directory whose owner has exited, and a server whose
// command line names a cluster directory that is gone or whose owner has
// exited (the server of a package whose TestMain did not stop it). The next
// Start reaps them; a whole test run must leave none. Clusters of test
// binaries still running are not listed.
func Leftovers() ([]string, error) {
	var out []string
	orphaned := func(dir string) bool {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			_, statErr := os.Stat(dir)
			return os.IsNotExist(statErr)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0 && !processAlive(pid)
	}
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), clusterPrefix+"*"))
	if err != nil {
		return nil, err
	}
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, ownerFile)); err == nil && orphaned(dir) {
			out = append(out, "cluster directory "+dir+" (its test binary has exited)")
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline") // Linux; elsewhere the directories tell
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		for i, a := range args {
			if a != "-D" || i+1 >= len(args) || !strings.Contains(args[i+1], clusterPrefix) {
				continue
			}
			dir := filepath.Dir(filepath.Clean(args[i+1])) // <cluster>/data
			if orphaned(dir) {
				out = append(out, fmt.Sprintf("server process %s (%s)", filepath.Base(filepath.Dir(p)), strings.Join(args, " ")))
			}
		}
	}
	return out, nil
}
