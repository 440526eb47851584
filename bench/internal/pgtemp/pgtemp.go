// Package pgtemp starts a throwaway PostgreSQL cluster for a benchmark run: initdb into a
// temporary directory, a server on 127.0.0.1 at a free port, and Stop to shut it down and
// remove every file. It needs the PostgreSQL server binaries (on Debian:
// `apt-get install postgresql`, which puts them in /usr/lib/postgresql/<version>/bin).
//
// PostgreSQL refuses to run as root. When the process is root, the cluster's directory is
// given to the "postgres" system user (which the Debian package creates) and initdb,
// pg_ctl and the server run as that user through runuser(1).
//
// The cluster keeps PostgreSQL's durable defaults (fsync = on, synchronous_commit = on,
// full_page_writes = on); only the connection limit is raised for 64-way runs.
package pgtemp

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
var ErrNoServer = errors.New("pgtemp: no PostgreSQL server binaries (initdb, pg_ctl) found; install them (Debian: apt-get install postgresql) or pass a DSN")

// Cluster is a running throwaway cluster.
type Cluster struct {
	DSN    string
	Dir    string
	BinDir string
	runAs  string // "" = as this process
}

// FindBinDir returns the directory holding initdb and pg_ctl: $PG_BINDIR if set, the
// newest /usr/lib/postgresql/*/bin, or the PATH.
func FindBinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
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

// Start creates and starts a cluster. Call Stop when done, also on error paths.
func Start(ctx context.Context) (*Cluster, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "receiptbench-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, BinDir: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtemp: running as root needs the postgres system user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		c.runAs = "postgres"
	}
	data := filepath.Join(dir, "data")
	if out, err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"); err != nil {
		c.remove()
		return nil, fmt.Errorf("pgtemp: initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		c.remove()
		return nil, err
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=200 -c fsync=on -c synchronous_commit=on", port, dir)
	if out, err := c.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "server.log"), "-o", opts, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		c.remove()
		return nil, fmt.Errorf("pgtemp: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	c.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return c, nil
}

// Stop shuts the server down and removes the cluster's files.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-m", "fast", "-w", "stop")
	if err != nil {
		err = fmt.Errorf("pgtemp: pg_ctl stop: %w\n%s", err, out)
	}
	return errors.Join(err, c.remove())
}

func (c *Cluster) remove() error { return os.RemoveAll(c.Dir) }

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
	addr := l.Addr().String()
	_, p, _ := strings.Cut(addr, ":")
	return strconv.Atoi(p)
}
