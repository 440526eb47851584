package pgtest

import (
	"context"

	"github.com/receiptstore/receipts/internal/pgcluster"
)

// The throwaway-cluster launcher is package pgcluster, which imports no testing package so
// that programs (receiptctl demo --pg, the examples' -pg) can start a cluster too. These names
// forward to it, so that tests keep to one import.

// ErrNoServer means no PostgreSQL server binaries were found (pgcluster.ErrNoServer).
var ErrNoServer = pgcluster.ErrNoServer

// Cluster is a running throwaway cluster (pgcluster.Cluster).
type Cluster = pgcluster.Cluster

// Config tunes a cluster (pgcluster.Config).
type Config = pgcluster.Config

// FindBinDir returns the directory holding initdb and pg_ctl (pgcluster.FindBinDir).
func FindBinDir() (string, error) { return pgcluster.FindBinDir() }

// Start creates and starts a cluster with fsync off (pgcluster.Start). Call Stop when done,
// also on error paths.
func Start(ctx context.Context) (*Cluster, error) { return pgcluster.Start(ctx) }

// StartWith creates and starts a cluster configured by cfg (pgcluster.StartWith).
func StartWith(ctx context.Context, cfg Config) (*Cluster, error) {
	return pgcluster.StartWith(ctx, cfg)
}

// Leftovers lists the throwaway clusters left behind by programs that are gone
// (pgcluster.Leftovers).
func Leftovers() ([]string, error) { return pgcluster.Leftovers() }
