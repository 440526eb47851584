package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Durability across a failover: what the engine relies on and checks (docs/postgresql-ha.md).
//
// With synchronous replication, PostgreSQL reports a COMMIT once the synchronous standby has
// it. A COMMIT whose wait for the standby is cancelled (pg_cancel_backend, statement_timeout,
// a client's cancel request) is committed on the primary only: the server warns "canceling
// wait for synchronous replication" and answers COMMIT. Other sessions see it at once, but a
// promotion of the standby loses it. The engine treats such a COMMIT as one whose reply was
// lost: its outcome is unknown until the engine can tell. A claim is not handed out (it is
// undone), a finish is not reported committed (Do returns ErrOutcomeUnknown, and the next
// attempt is Recovered, or replays the receipt if the primary keeps it). It sees the warning
// through the pool's notice handler, which Configure installs; and it never cancels a COMMIT
// it sent itself (detach.go): neither pgx's deadline nor its cancel request ever reach one.

// ErrNotReplicated is wrapped by the errors of calls whose COMMIT PostgreSQL made on the
// primary only: the wait for the synchronous standby was cancelled (the warning "canceling
// wait for synchronous replication"), so a failover may lose it. A Claim that returns it
// handed out nothing (the claim is undone); a Do or a finish that returns it is an unknown
// outcome (ErrOutcomeUnknown): the effect may have happened, and the receipt may or may not
// survive a failover.
var ErrNotReplicated = errors.New("pgstore: commit not confirmed by a synchronous standby")

// ErrNoSyncStandby is wrapped by the errors of Open and of claims when
// Options.RequireSyncStandby is set and the database cannot promise that a commit survives a
// failover: no synchronous standby is streaming, synchronous_commit is below on, the session
// is not on a primary, the role may not read pg_stat_replication, or the pool was not built
// with Configure (a COMMIT made on the primary only could not be told).
var ErrNoSyncStandby = errors.New("pgstore: no synchronous standby")

// ErrPoolNotConfigured is wrapped by the errors of Open, and of claims, on a pool built
// without Configure (for instance with plain pgxpool.New) while the database has a synchronous
// standby (synchronous_standby_names is set): on such a pool a COMMIT whose wait for the
// standby was cancelled, which a failover loses, could not be told from a durable one, so
// Do would report receipts that a failover loses and Claim would hand out leases that a
// failover loses (an effect run twice). Build the pool with Configure (its doc shows how).
// Without synchronous_standby_names a pool without Configure opens: nothing waits for a
// standby there, so there is nothing to tell. The state is read at Open and every second: a
// store opened before synchronous_standby_names was set refuses claims from then on.
var ErrPoolNotConfigured = errors.New("pgstore: the pool was not built with pgstore.Configure")

// noticeKey is where the notice handler keeps, in a connection's CustomData, the warning
// PostgreSQL sent last on it.
const noticeKey = "github.com/receiptstore/receipts/pgstore.warning"

// Configure prepares cfg, the configuration of a pool that pgstore.Open will be given, for
// what pgstore relies on: a notice handler (cfg.ConnConfig.OnNotice) that tells the engine
// when PostgreSQL warns during a COMMIT it sent that the wait for the synchronous standby was
// cancelled. A handler already set still receives every notice. Build pools for pgstore with
// it:
//
//	cfg, err := pgxpool.ParseConfig(dsn)
//	...
//	pgstore.Configure(cfg)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// On a pool built without it the engine cannot tell such a COMMIT from a durable one: while
// the database has a synchronous standby (synchronous_standby_names set), Open refuses such a
// pool, and claims are refused, with an error wrapping ErrPoolNotConfigured; without one it
// opens, and the metric postgres_commit_check is 0. Nothing else in cfg is changed: pgstore
// works with any other pgx setting (the query execution mode, the context watcher handler,
// statement_timeout).
func Configure(cfg *pgxpool.Config) {
	if cfg == nil || cfg.ConnConfig == nil {
		return
	}
	prev := cfg.ConnConfig.OnNotice
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if severity(n) == "WARNING" {
			c.CustomData()[noticeKey] = n
		}
		if prev != nil {
			prev(c, n)
		}
	}
}

func severity(n *pgconn.Notice) string {
	if n.SeverityUnlocalized != "" {
		return n.SeverityUnlocalized
	}
	return n.Severity
}

// checkedCommit runs send, which sends a COMMIT on pc (or a statement that commits on its
// own), and returns its error; if it succeeded but PostgreSQL warned meanwhile (the pool's
// notice handler: Configure), an error wrapping ErrNotReplicated. Every COMMIT the engine
// sends goes through it. The only warnings PostgreSQL sends on a COMMIT of the engine's
// statements are the cancelled wait for the synchronous standby ("canceling wait for
// synchronous replication", SQLSTATE 01000, or 57P01 when the backend is being terminated);
// any warning counts, so a COMMIT is never reported durable on a doubt.
func (e *engine) checkedCommit(pc *pgconn.PgConn, send func() error) error {
	delete(pc.CustomData(), noticeKey) // a warning of an earlier statement (fn's, in DoTx) is not the COMMIT's
	err := send()
	n, warned := pc.CustomData()[noticeKey].(*pgconn.Notice)
	delete(pc.CustomData(), noticeKey)
	if err != nil || !warned {
		return err
	}
	e.unconfirmed.Add(1)
	return fmt.Errorf("%w: %s (SQLSTATE %s)", ErrNotReplicated, n.Message, n.Code)
}

// commitCheckOn probes whether the pool's connections have the notice handler (Configure): a
// warning raised on purpose must reach it.
func (e *engine) commitCheckOn(ctx context.Context) (bool, error) {
	c, err := e.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	pc := c.Conn().PgConn()
	delete(pc.CustomData(), noticeKey)
	if _, err := c.Exec(ctx, `DO $$BEGIN RAISE WARNING 'receipts: a probe of the notice handler (pgstore.Configure)'; END$$`); err != nil {
		return false, err
	}
	_, ok := pc.CustomData()[noticeKey]
	delete(pc.CustomData(), noticeKey)
	return ok, nil
}

// confirmDurable tells whether everything the primary committed before it is on the
// synchronous standby: it commits a transaction of its own that writes WAL (a transactional
// logical message, read by nobody), whose COMMIT waits for the standby like any other; once it
// is confirmed (checkedCommit: no warning), so is every earlier commit, the standby receiving
// WAL in order. The engine asks it before it reports an outcome it read back after a lost
// reply: what a session reads may be committed on the primary only. Without synchronous
// replication it costs a local flush. It runs uncancelled (unCancelled).
func (e *engine) confirmDurable(ctx context.Context) error {
	var err error
	if !e.unCancelled(ctx, func(ctx context.Context) {
		var c *pgxpool.Conn
		if c, err = e.pool.Acquire(ctx); err != nil {
			return
		}
		defer c.Release()
		err = e.checkedCommit(c.Conn().PgConn(), func() error {
			_, err := c.Exec(ctx, `SELECT pg_logical_emit_message(true, 'receipts', '')`)
			return err
		})
	}) {
		return ctx.Err()
	}
	if err != nil {
		return errorf("confirming that it is on the synchronous standby: %w", err)
	}
	return nil
}

// unCancelled runs f, whose statements commit, on a context that the caller's cannot cancel:
// on the caller's goroutine if ctx can never end (the root's detached contexts), else
// detached (detachCall), the caller waiting for f or for ctx. false: ctx ended first, and f
// goes on.
func (e *engine) unCancelled(ctx context.Context, f func(ctx context.Context)) bool {
	if ctx.Done() == nil {
		f(ctx)
		return true
	}
	return e.detachCall(ctx, func(ctx context.Context, _ func() bool) { f(ctx) }, func() {})
}

// replication is what the engine last read of the server's replication (replicationCheck).
type replication struct {
	syncCommit   string // synchronous_commit, as the engine's sessions have it
	standbyNames string // synchronous_standby_names
	primary      bool   // the session is on a primary (not in recovery)
	visible      bool   // the role may read pg_stat_replication's details (superuser, pg_read_all_stats)
	syncUp       int    // synchronous (sync or quorum) standbys streaming
	at           time.Time
	err          error // the read failed: the rest is the zero value
}

// durableCommit reports whether synchronous_commit makes a COMMIT wait for the standby to
// flush it (on, remote_apply; remote_write waits only for its write, which an OS crash of the
// standby can lose).
func (r *replication) durableCommit() bool {
	return r.syncCommit == "on" || r.syncCommit == "remote_apply"
}

// standbyUp reports whether a synchronous standby is configured and streaming.
func (r *replication) standbyUp() bool {
	return r.err == nil && strings.TrimSpace(r.standbyNames) != "" && r.syncUp > 0
}

// syncCommitLevel is synchronous_commit as a number for the metric: 0 off, 1 local,
// 2 remote_write, 3 on, 4 remote_apply (-1 unknown).
func (r *replication) syncCommitLevel() float64 {
	switch r.syncCommit {
	case "off":
		return 0
	case "local":
		return 1
	case "remote_write":
		return 2
	case "on":
		return 3
	case "remote_apply":
		return 4
	}
	return -1
}

// why is the reason a commit may not survive a failover ("" if none), for RequireSyncStandby.
func (e *engine) noSyncStandby(r *replication) string {
	switch {
	case r.err != nil:
		return "cannot read the replication state: " + r.err.Error()
	case !r.primary:
		return "the session is not on a primary (pg_is_in_recovery)"
	case !r.durableCommit():
		return "synchronous_commit is " + r.syncCommit + " (want on or remote_apply)"
	case strings.TrimSpace(r.standbyNames) == "":
		return "synchronous_standby_names is empty"
	case !r.visible:
		return "the role may not read pg_stat_replication (grant it pg_monitor or pg_read_all_stats)"
	case r.syncUp == 0:
		return "no synchronous standby is streaming (pg_stat_replication)"
	case !e.commitCheck.Load():
		return "the pool was not built with pgstore.Configure: a COMMIT made on the primary only cannot be told"
	}
	return ""
}

// replicationCheckInterval is how often the engine reads the replication state.
const replicationCheckInterval = time.Second

// readReplication reads the server's replication state on one of the pool's sessions.
func (e *engine) readReplication(ctx context.Context) *replication {
	r := &replication{at: time.Now()}
	var inRecovery bool
	r.err = e.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
       pg_is_in_recovery(),
       coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
         OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),
       (SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))`).
		Scan(&r.syncCommit, &r.standbyNames, &inRecovery, &r.visible, &r.syncUp)
	r.primary = !inRecovery
	if r.err != nil {
		*r = replication{at: r.at, err: r.err}
	}
	return r
}

// watchReplication refreshes e.repl every replicationCheckInterval until Close.
func (e *engine) watchReplication() {
	defer e.wg.Done()
	t := time.NewTicker(replicationCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(e.ctx, replicationCheckInterval)
			e.repl.Store(e.readReplication(ctx))
			cancel()
		}
	}
}

// requireSyncStandby returns an error wrapping ErrPoolNotConfigured if the pool was not built
// with Configure and the server, as last read, has synchronous_standby_names set (with
// Options.RequireSyncStandby it wraps ErrNoSyncStandby too); or one wrapping ErrNoSyncStandby
// if Options.RequireSyncStandby is set and the replication state last read cannot promise
// that a commit survives a failover.
func (e *engine) requireSyncStandby() error {
	r := e.repl.Load()
	if err := e.requireConfigured(r); err != nil {
		if e.o.RequireSyncStandby {
			return errorf("%w: %w", ErrNoSyncStandby, err)
		}
		return err
	}
	if !e.o.RequireSyncStandby {
		return nil
	}
	if why := e.noSyncStandby(r); why != "" {
		return fmt.Errorf("%w: %s", ErrNoSyncStandby, why)
	}
	return nil
}

// requireConfigured returns an error wrapping ErrPoolNotConfigured if the pool has no notice
// handler (Configure) while r says synchronous_standby_names is set: a COMMIT made on the
// primary only would then be reported durable.
func (e *engine) requireConfigured(r *replication) error {
	if e.commitCheck.Load() || r == nil || r.err != nil || strings.TrimSpace(r.standbyNames) == "" {
		return nil
	}
	return fmt.Errorf("%w, and the database has a synchronous standby (synchronous_standby_names = %q): "+
		"a COMMIT whose wait for the standby is cancelled could not be told from a durable one, and a failover would lose it; "+
		"build the pool with pgstore.Configure(cfg) before pgxpool.NewWithConfig(ctx, cfg)", ErrPoolNotConfigured, r.standbyNames)
}

// durabilityState holds the engine's view of what survives a failover, for Metrics.
type durabilityState struct {
	repl        atomic.Pointer[replication]
	commitCheck atomic.Bool   // the pool's connections have the notice handler (Configure)
	unconfirmed atomic.Uint64 // COMMITs PostgreSQL warned about (ErrNotReplicated)
}
