package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
)

// Options configure a store on PostgreSQL. A nil *Options means all defaults.
type Options struct {
	// Options are the settings every engine shares (Retention, LeaseTTL, EpochWidth,
	// GCInterval, Logger, BeforeReplay), with the same defaults and bounds as on Pebble.
	// Now left nil means the database's clock (clock_timestamp()), so nodes whose clocks
	// disagree still agree on leases and expiry; tests inject one. The Pebble engine's
	// fields (Pebble, CompactOnGC, ReplayCacheSize) must be zero: ErrInvalidOptions.
	// EpochWidth is used only when the schema is created; later opens use the stored one.
	receipts.Options

	// Schema is the PostgreSQL schema holding the store's tables, created (or checked) by
	// Open. Default "receipts"; [a-z_][a-z0-9_]*, at most 40 bytes. Several stores may
	// share one database in different schemas; every node of one store uses the same.
	Schema string

	// ListenConn opens the dedicated session on which this node LISTENs for other nodes'
	// wake-ups (a waiter here learns of a commit, release or abandon on another node
	// within a notify flush plus a round trip). It must reach PostgreSQL directly or
	// through a session-mode pooler: LISTEN does not work through PgBouncer in
	// transaction mode. nil: poll-only mode. Waiters on this node then learn of other
	// nodes' writes by re-reading every PollInterval (and within the waiting loop's own
	// re-check of 250 ms); writes on this node still wake its waiters at once, and this
	// node still NOTIFYs the nodes that do listen (NOTIFY works through any pooler).
	// The session is reopened (with backoff) when it breaks; Close closes it.
	ListenConn func(ctx context.Context) (*pgx.Conn, error)

	// PollInterval is how often this node's waiters re-read when no LISTEN session is up
	// (poll-only mode, or while the listener reconnects). Default 1s.
	PollInterval time.Duration

	// RequireSyncStandby refuses to open, and to claim (an error wrapping ErrNoSyncStandby),
	// while a commit might not survive a failover: unless the session is on a primary with
	// synchronous_commit on (or remote_apply), synchronous_standby_names set and a
	// synchronous standby streaming (pg_stat_replication, which the role must be allowed to
	// read: pg_monitor), and the pool was built with Configure. The state is read at Open and
	// every second. Off by default; recommended in production with a standby
	// (docs/postgresql-ha.md). It refuses new claims only: a lease already held still
	// commits, and its COMMIT waits for the standby as PostgreSQL makes it.
	RequireSyncStandby bool
}

// Open opens the store in opts.Schema of pool's database, creating the schema if it is
// absent, and returns a *receipts.DB served by PostgreSQL: every node of a service opens
// the same database and schema, and they share one store (claims, receipts, leases and
// wake-ups across nodes). The pool stays the caller's: Close does not close it, but it
// must stay open until the DB is closed.
//
// Open fails with ErrInvalidOptions for options that cannot work (including the Pebble
// engine's fields, a bad schema name, or a stored epoch width too narrow for Retention,
// which leaves the schema as it is), ErrUnknownFormat for a schema written by a newer
// version (left as it is), ErrCorrupt for damaged meta data, ErrPoolNotConfigured for a pool
// built without Configure (plain pgxpool.New) on a database with synchronous_standby_names
// set, or the database's error.
//
// On the DB it returns, Pebble returns nil, and CommitWith, DoBatch, RunBatch and
// Checkpoint return ErrUnsupported: stage a receipts.Effect on a pgx.Tx
// (receipts.Lease.Stage), or use DoTx and CommitTx, this engine's own forms.
func Open(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*receipts.DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	return receipts.OpenEngine(func(cfg driver.Config) (driver.Engine, error) {
		e, err := openPG(ctx, pool, cfg, o)
		if err != nil {
			return nil, err // not a nil *engine in a non-nil interface
		}
		return e, nil
	}, &o.Options)
}

// openPG is the engine's constructor for receipts.OpenEngine.
func openPG(ctx context.Context, pool *pgxpool.Pool, cfg driver.Config, o Options) (*engine, error) {
	return newEngine(ctx, pool, engineOptions{
		Schema:                o.Schema,
		Retention:             cfg.Retention,
		LeaseTTL:              cfg.LeaseTTL,
		StoredRetention:       cfg.StoredRetention,
		StoredLeaseTTL:        cfg.StoredLeaseTTL,
		TombstoneWindow:       cfg.TombstoneWindow,
		StoredTombstoneWindow: cfg.StoredTombstoneWindow,
		EpochWidth:            cfg.EpochWidth,
		Now:                   cfg.Now,
		ListenConn:            o.ListenConn,
		PollInterval:          o.PollInterval,
		RequireSyncStandby:    o.RequireSyncStandby,
		Logger:                cfg.Logger,
		Check:                 cfg.Check,
		Closing:               cfg.Closing,
	})
}
