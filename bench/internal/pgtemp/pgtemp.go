// Package pgtemp starts a throwaway PostgreSQL cluster for a benchmark run: initdb into a
// temporary directory, a server on 127.0.0.1 at a free port, and Stop to shut it down and
// remove every file. It needs the PostgreSQL server binaries (on Debian:
// `apt-get install postgresql`, which puts them in /usr/lib/postgresql/<version>/bin).
//
// It is the root module's internal/pgcluster launcher (which the library's tests use through
// internal/pgtest) with fsync on: PostgreSQL's durable defaults (fsync = on, synchronous_commit
// = on, full_page_writes = on), only the connection limit raised for 64-way runs. As root, the cluster runs as the
// "postgres" system user through runuser(1), since PostgreSQL refuses to run as root.
package pgtemp

import (
	"context"

	"github.com/receiptstore/receipts/internal/pgcluster"
)

// ErrNoServer means no PostgreSQL server binaries were found.
var ErrNoServer = pgcluster.ErrNoServer

// Cluster is a running throwaway cluster (DSN, Dir, BinDir; Stop).
type Cluster = pgcluster.Cluster

// FindBinDir returns the directory holding initdb and pg_ctl: $PG_BINDIR if set, the
// newest /usr/lib/postgresql/*/bin, `pg_config --bindir`, or the PATH.
func FindBinDir() (string, error) { return pgcluster.FindBinDir() }

// Start creates and starts a durable cluster. Call Stop when done, also on error paths.
func Start(ctx context.Context) (*Cluster, error) {
	return pgcluster.StartWith(ctx, pgcluster.Config{Durable: true})
}
