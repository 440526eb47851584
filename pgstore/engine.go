package pgstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
)

var _ driver.Engine = (*engine)(nil)

// Defaults of engineOptions.
const (
	defaultSchema          = "receipts"
	defaultNotifyInterval  = 10 * time.Millisecond
	defaultPollInterval    = time.Second
	defaultPartitionsAhead = 2
	defaultMaintLease      = time.Minute
	minEpochWidth          = time.Microsecond // the unit widths are stored in
)

// engineOptions configure the engine. Zero values mean the defaults.
type engineOptions struct {
	// Schema holds the engine's tables (created if absent). Default "receipts".
	Schema string
	// Retention: a record is visible until its last write plus Retention. Default 24h.
	Retention time.Duration
	// LeaseTTL is the default lease length (Config); claims carry their own.
	LeaseTTL time.Duration
	// EpochWidth is the width of the time partitions (default Retention/4, at least 1 ms). It
	// is used only when the schema is created; later opens use the stored width.
	EpochWidth time.Duration
	// Now, if set, replaces the database's clock (tests). nil: every decision uses the
	// database's clock_timestamp(), so nodes whose clocks disagree still agree.
	Now func() time.Time
	// ListenConn opens the dedicated session the engine LISTENs on for other nodes' wake-ups.
	// It must not go through a transaction pooler (PgBouncer in transaction mode breaks
	// LISTEN). nil: poll-only mode, waiters on this node learn of other nodes' commits by
	// polling every PollInterval.
	ListenConn func(ctx context.Context) (*pgx.Conn, error)
	// NotifyInterval is how long the notifier coalesces wake-ups before it sends them in one
	// transaction of its own. Default 10 ms; negative: never NOTIFY (other nodes poll).
	NotifyInterval time.Duration
	// PollInterval is how often local waiters are woken to re-read when no LISTEN session is
	// up (poll-only mode, or while the listener reconnects). Default 1 s.
	PollInterval time.Duration
	// PartitionsAhead is how many epochs past the current one GC creates in advance. Default 2.
	PartitionsAhead int
	// MaintLease is how long a GC pass holds the maintenance lease (one node at a time runs
	// partition maintenance; another takes over once the lease has run out). Default 1 min.
	MaintLease time.Duration
	// Logger receives background errors (notifier, listener). Default: discarded.
	Logger *slog.Logger
	// StoredRetention and StoredLeaseTTL: the option was left zero, so an existing schema's
	// recorded value takes the place of the default (driver.Config).
	StoredRetention, StoredLeaseTTL bool
	// TombstoneWindow is how long after a record's retention ends its key stays tombstoned
	// (driver.Config.TombstoneWindow): > 0 on, < 0 off; 0 (or StoredTombstoneWindow) means
	// the schema's recorded window, or driver.DefaultTombstoneWindow(Retention).
	TombstoneWindow       time.Duration
	StoredTombstoneWindow bool
	// Check, if set, validates the settings in force (the recorded values put in, the
	// stored epoch width) once meta is read, before anything is written (driver.Config.Check);
	// its error is returned wrapped.
	Check func(inForce driver.Config) error
	// RequireSyncStandby refuses to open, and to claim, while a commit might not survive a
	// failover (Options.RequireSyncStandby).
	RequireSyncStandby bool
	// Closing, if set, reports whether the DB's Close has begun (driver.Config.Closing):
	// from then on Claim hands out no lease (driver.ErrClosed). It is asked after a claim's
	// statement has answered (its time was taken) and before the claim's transaction commits.
	Closing func() bool
}

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

func (o *engineOptions) fill() error {
	if o.Schema == "" {
		o.Schema = defaultSchema
	}
	if !schemaName.MatchString(o.Schema) {
		return fmt.Errorf("%w: schema name %q (want [a-z_][a-z0-9_]*, at most 40 bytes)", receipts.ErrInvalidOptions, o.Schema)
	}
	if o.Retention == 0 {
		o.Retention = receipts.DefaultRetention
	}
	if o.Retention < 0 {
		return fmt.Errorf("%w: negative Retention %s", receipts.ErrInvalidOptions, o.Retention)
	}
	if o.EpochWidth == 0 {
		o.EpochWidth = max(o.Retention/4, minEpochWidth)
	}
	if o.EpochWidth < minEpochWidth {
		return fmt.Errorf("%w: EpochWidth %s below %s (the unit it is stored in)", receipts.ErrInvalidOptions, o.EpochWidth, minEpochWidth)
	}
	if o.NotifyInterval == 0 {
		o.NotifyInterval = defaultNotifyInterval
	}
	if o.PollInterval <= 0 {
		o.PollInterval = defaultPollInterval
	}
	if o.PartitionsAhead <= 0 {
		o.PartitionsAhead = defaultPartitionsAhead
	}
	if o.MaintLease <= 0 {
		o.MaintLease = defaultMaintLease
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = receipts.DefaultLeaseTTL
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// closing reports whether the DB's Close has begun (Config.Closing).
func (e *engine) closing() bool { return e.o.Closing != nil && e.o.Closing() }

// engine is the PostgreSQL implementation of driver.Engine.
type engine struct {
	pool   *pgxpool.Pool
	o      engineOptions
	q      queries
	width  int64 // epoch width in microseconds (from meta)
	mwidth int64 // markers partition width in microseconds (from meta): a multiple of width
	secret []byte
	me     string // this engine's maintenance-lease owner id

	// skew is the database clock minus the local clock (ns), refreshed from every statement
	// that returns the database's time; it only serves to bound partition probes (oldest).
	skew atomic.Int64
	// hwm is the engine's time high-water mark (Unix ns): the latest time it has used. Every
	// statement's time is at least hwm (the injected clock is raised to it in Go, the
	// database's in SQL: queries.clock), so the engine's time never runs backwards: a clock
	// stepped back lets no live lease be taken over early and no receipt expire early, and
	// writes meanwhile use the engine's time (which stands still), so their windows do not
	// start in the past. It starts, at Open, from meta.clock (what the store's nodes used
	// before: written by Close and by every GC pass) and the newest partition holding
	// records, so a restart with the clock behind resumes from there.
	hwm atomic.Int64

	diskBytes atomic.Uint64 // the schema's disk usage, as the last Count measured it

	hub      hub
	notifier notifier
	listenUp atomic.Bool

	// For Metrics: listener sessions opened (the first and each reconnect), notify
	// statements sent, and notify statements that failed.
	listens, flushes, flushErrors atomic.Uint64

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// bg is the work done for callers who have gone: detached COMMITs and what settles
	// them (detach.go). Close waits for it before it cancels ctx.
	bg        background
	closeOnce sync.Once

	// testLoseReply, if set, is called after a claim statement succeeded; an error from it is
	// treated as if the reply had been lost on the network (tests of the nonce path).
	testLoseReply func() error
	// testNoReplayFast turns replayFast off (tests and measurements of the claim path), and
	// replayFastHits counts the claims it answered (replay.go).
	testNoReplayFast bool
	replayFastHits   atomic.Uint64
	// testNoLookupIn sends the fast path's read to the parent (measurements), and
	// lookupInHits counts the reads one partition answered (lookupIn).
	testNoLookupIn bool
	lookupInHits   atomic.Uint64
	// lookupInText holds lookupIn's statements by epoch, lookupManyText lookupManyIn's.
	lookupInText, lookupManyText epochTexts

	// leases remembers where the records of this engine's open leases are, for Finish
	// (finish.go); testNoFinishIn turns that off (tests and measurements), finishInHits
	// counts the finishes the aimed statement wrote, and finishInText holds its statements by
	// epoch.
	leases         leaseEpochs
	testNoFinishIn bool
	finishInHits   atomic.Uint64
	finishInText   epochTexts
	finishManyText epochTexts

	// Calls of different keys that arrive together are sent as one statement (combiner.go):
	// claims first claims, in one transaction (claim.go), finishes aimed finishes
	// (finish.go), lookups the replay fast path's reads (replay.go); testNoBatch
	// sends each alone (tests and measurements).
	claims      *combiner[freshV]
	finishes    *combiner[finishV]
	lookups     *combiner[lookupV]
	testNoBatch bool
	// testLoseBatch, if set, is asked after a batch of two or more was answered; true: its
	// answers are dropped as if the reply had been lost (tests of the lost-reply path).
	testLoseBatch func() bool
	// batchFailures counts the batches that failed (a server error, a lost reply), whose
	// calls then went on alone (EngineMetrics).
	batchFailures atomic.Uint64

	// bound holds DoTx's transactions by their leases' tokens (effects.go).
	bound boundTxs

	// hint remembers the keys recently seen finished: it picks a claim's first statement
	// (replay.go).
	hint finishedHint

	// What survives a failover (syncrep.go): the replication state last read, whether the
	// pool's notice handler tells a COMMIT made on the primary only, and how many were.
	durabilityState
}

// newEngine creates or migrates the schema and starts the background goroutines (notifier,
// listener, poller); Close stops them. The pool is the caller's and is not closed.
func newEngine(ctx context.Context, pool *pgxpool.Pool, o engineOptions) (*engine, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", receipts.ErrInvalidOptions)
	}
	if err := o.fill(); err != nil {
		return nil, err
	}
	e := &engine{pool: pool, o: o, q: buildQueries(o.Schema, o.Now != nil, false, 1)}
	e.claims, e.finishes, e.lookups = e.newFreshCombiner(), e.newFinishCombiner(), e.newLookupCombiner()
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	e.me = hex.EncodeToString(id)
	if err := e.checkDurability(ctx); err != nil { // before anything is written
		return nil, err
	}
	if err := e.migrate(ctx); err != nil {
		return nil, err
	}
	e.q = buildQueries(o.Schema, o.Now != nil, e.tombs(), e.mwidth/e.width) // the window in force is known now
	if err := e.loadClockFromRecords(ctx); err != nil {
		return nil, err
	}
	if _, err := e.Now(ctx); err != nil {
		return nil, err
	}
	cur := e.epochOf(e.estimate())
	for ep := cur; ep <= cur+int64(o.PartitionsAhead); ep++ {
		if err := e.ensurePartition(ctx, ep); err != nil {
			return nil, err
		}
	}
	e.hub.init()
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.notifier.init(e)
	e.wg.Add(3)
	go e.notifier.run()
	go e.poll()
	go e.watchReplication()
	if o.ListenConn != nil {
		e.wg.Add(1)
		go e.listen()
	}
	return e, nil
}

// Name implements driver.Engine.
func (e *engine) Name() string { return "postgres" }

// Config implements driver.Engine: the settings in force (Retention and LeaseTTL with the
// recorded values for the options left zero), with the epoch width the schema was created
// with.
func (e *engine) Config() driver.Config {
	return driver.Config{
		Retention:       e.o.Retention,
		LeaseTTL:        e.o.LeaseTTL,
		EpochWidth:      time.Duration(e.width) * time.Microsecond,
		StoredRetention: e.o.StoredRetention,
		StoredLeaseTTL:  e.o.StoredLeaseTTL,
		// the window in force once the schema is read (-1: off)
		TombstoneWindow:       e.o.TombstoneWindow,
		StoredTombstoneWindow: e.o.StoredTombstoneWindow,
		Now:                   e.o.Now,
		Logger:                e.o.Logger,
		Check:                 e.o.Check,
		Closing:               e.o.Closing,
	}
}

// tombs reports whether tombstones are on (a positive window in force).
func (e *engine) tombs() bool { return e.o.TombstoneWindow > 0 }

// windowUS is the window in force as meta records it: µs, -1 when off.
func (e *engine) windowUS() int64 {
	if !e.tombs() {
		return -1
	}
	return e.o.TombstoneWindow.Microseconds()
}

// tombUS is Retention + TombstoneWindow in µs: a key's newest write tombstones it until then.
func (e *engine) tombUS() int64 { return e.retentionUS() + max(e.windowUS(), 0) }

// markerBottom is the oldest markers partition whose markers can be in force: the one of now
// - Retention - TombstoneWindow, less one records epoch of margin (as oldest). It only prunes
// the probes.
func (e *engine) markerBottom() int64 {
	return e.markerEpoch(e.epochOf(e.estimate().Add(-e.o.Retention-max(e.o.TombstoneWindow, 0))) - 1)
}

// recordBottom is the oldest records epoch whose records can be tombstones: the first epoch of
// markerBottom's markers partition (the claim statements derive it from $10 the same way).
func (e *engine) recordBottom() int64 { return e.markerBottom() * (e.mwidth / e.width) }

// Secret implements driver.Engine.
func (e *engine) Secret() []byte { return e.secret }

// Close stops the background goroutines and closes the LISTEN session; what the engine still
// does for callers who have gone (a COMMIT in flight, the undoing of a claim nobody holds:
// detach.go) is waited for first, up to settleTimeout; wake-ups still queued are sent first, and the engine's time is recorded in meta (a restart with the clock behind
// resumes from it), both bounded by one second. The pool stays open (it is the caller's).
func (e *engine) Close() error {
	e.closeOnce.Do(func() {
		if !e.bg.close(settleTimeout) { // a send still waits for the server: cut it short
			e.o.Logger.Warn("pgstore: close: work for callers who have gone is still running; cancelling it")
		}
		e.cancel()
		e.bg.wg.Wait()
		e.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		e.notifier.flush(ctx)
		if err := e.saveClock(ctx); err != nil {
			e.o.Logger.Warn("pgstore: close: record the clock", "err", err)
		}
	})
	return nil
}

// saveClock records the engine's time in meta.clock (never lowering it).
func (e *engine) saveClock(ctx context.Context) error {
	h := e.hwm.Load()
	if h == 0 {
		return nil
	}
	_, err := e.pool.Exec(ctx, `UPDATE `+e.q.schema+`.meta SET clock = greatest(clock, $1::timestamptz)`, time.Unix(0, h))
	return err
}

// raise moves the high-water mark up to t (ns) and returns the engine's time: t, or the mark
// if it is later.
func (e *engine) raise(t int64) int64 {
	for {
		h := e.hwm.Load()
		if t <= h {
			return h
		}
		if e.hwm.CompareAndSwap(h, t) {
			return t
		}
	}
}

// Now implements driver.Engine: the injected clock, or the database's clock_timestamp(),
// never earlier than a time the engine has already used.
func (e *engine) Now(ctx context.Context) (time.Time, error) {
	if e.o.Now != nil {
		return e.nowArg().(time.Time), nil
	}
	var t time.Time
	if err := e.pool.QueryRow(ctx, "SELECT "+e.q.clock("$1"), e.nowArg()).Scan(&t); err != nil {
		return time.Time{}, errorf("pgstore: now: %w", err)
	}
	return e.saw(t, nil), nil
}

// nowArg is a statement's clock parameter (see queries.clock): the injected time raised to
// the high-water mark (which it then raises), or, on the database's clock, the mark (NULL if
// there is none yet).
func (e *engine) nowArg() any {
	if e.o.Now != nil {
		t := e.o.Now()
		ns := t.UnixNano()
		if h := e.raise(ns); h != ns {
			return time.Unix(0, h).In(t.Location())
		}
		return t
	}
	if h := e.hwm.Load(); h != 0 {
		return time.Unix(0, h)
	}
	return nil
}

// saw takes the time a statement answered with, given the clock parameter arg it was sent
// (nil: not known): on the database's clock it raises the high-water mark to it and keeps the
// skew estimate fresh, and returns it; on an injected clock it returns arg itself, at full
// resolution (the database keeps microseconds: its decisions at the truncated time are the
// same, every stored time being a whole microsecond).
func (e *engine) saw(db time.Time, arg any) time.Time {
	if e.o.Now != nil {
		if t, ok := arg.(time.Time); ok {
			return t
		}
		return db
	}
	if !db.IsZero() {
		e.skew.Store(int64(time.Until(db)))
		e.raise(db.UnixNano())
	}
	return db
}

// estimate is the engine's best guess of its time without asking the database.
func (e *engine) estimate() time.Time {
	t := time.Now().Add(time.Duration(e.skew.Load()))
	if e.o.Now != nil {
		t = e.o.Now()
	}
	if h := e.hwm.Load(); t.UnixNano() < h {
		return time.Unix(0, h).In(t.Location())
	}
	return t
}

// epochOf is the epoch (partition) of time t.
func (e *engine) epochOf(t time.Time) int64 {
	us := t.UnixMicro()
	if us < 0 {
		return (us - e.width + 1) / e.width
	}
	return us / e.width
}

// oldest is the oldest epoch that can hold a visible record: the epoch of now - Retention,
// less one epoch of margin for the error of the clock estimate. It only prunes the partition
// probes; visibility itself is decided by the database's clock in every statement.
func (e *engine) oldest() int64 {
	return e.epochOf(e.estimate().Add(-e.o.Retention)) - 1
}

func (e *engine) retentionUS() int64 { return e.o.Retention.Microseconds() }

// keyHash is the opaque 16-byte name of a key in wake-ups (NOTIFY payloads are readable by
// anyone in the database, so they never carry scope or ID).
func keyHash(k driver.Key) [16]byte {
	h := sha256.New()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(k.Scope)))
	h.Write(n[:])
	h.Write([]byte(k.Scope))
	h.Write([]byte(k.ID))
	var out [16]byte
	copy(out[:], h.Sum(nil))
	return out
}

// lockID is the advisory-lock id of a key (second half of the two-int form; the first is the
// lock class lockClass, which keeps our locks apart from the application's).
func lockID(h [16]byte) int32 { return int32(binary.BigEndian.Uint32(h[:4])) }

// lockClass is 'RCPT' as an int4: the first key of every advisory lock the engine takes.
const lockClass int32 = 0x52435054

func newNonce() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}

// Error classification.

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// retryable: serialization failure (e.g. a concurrent update moved the row to another
// partition) or deadlock; the statement had no effect.
func retryable(err error) bool {
	c := pgCode(err)
	return c == "40001" || c == "40P01"
}

// uniqueViolation: the fresh claim statement's INSERT met a row of the key its snapshot did
// not see (queries.fresh); the claim is re-sent, as one that returned no row.
func uniqueViolation(err error) bool { return pgCode(err) == "23505" }

// divisionByZero: the error queries.finishMust raises when its fence did not hold.
func divisionByZero(err error) bool { return pgCode(err) == "22012" }

// noPartition: a row's epoch has no partition yet (maintenance has not created it).
func noPartition(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23514" && containsNoPartition(pe.Message)
}

func containsNoPartition(msg string) bool { return regexpNoPartition.MatchString(msg) }

var regexpNoPartition = regexp.MustCompile(`no partition of relation .* found for row`)

// lostReply: the statement failed without an answer from the server (the connection broke,
// or could not be had): it may or may not have run. A claim retried after this keeps its
// nonce, so if it did run it recognises itself. pgx answers pgconn.ErrConnClosed, bare, for a
// simple-protocol statement whose reply it lost (pgx.Tx's Commit: DoTx's abandonment), so it
// counts too: read as a definite failure, it reported a landed COMMIT as failed.
func lostReply(ctx context.Context, err error) bool {
	if c := pgCode(err); c != "" {
		// connection exceptions and operator intervention (shutdown, crash, restart)
		return ctx.Err() == nil && (strings.HasPrefix(c, "08") || strings.HasPrefix(c, "57P"))
	}
	if err == nil || ctx.Err() != nil || errors.Is(err, pgx.ErrNoRows) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &ne) || errors.As(err, &ce) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, errLostReply) || errors.Is(err, errBatchLost)
}

// mayHaveLanded reports whether a send that carried a COMMIT failed without the server's
// answer: what it would have committed may or may not have been (ctx aside: a send whose
// own context ended has lost its reply too). A COMMIT made on the primary only
// (ErrNotReplicated) was answered: its sender undoes what it decided.
func mayHaveLanded(err error) bool {
	if err == nil || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, ErrNotReplicated) {
		return false
	}
	c := pgCode(err)
	return c == "" || strings.HasPrefix(c, "08") || strings.HasPrefix(c, "57P")
}

// errLostReply is what testLoseReply hooks return.
var errLostReply = errors.New("pgstore: reply lost (test)")

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Metrics reports the engine's health figures (driver.MetricsReporter): its wake-up
// machinery and its connection pool.
func (e *engine) Metrics() []driver.Metric {
	up := 0.0
	if e.listenUp.Load() {
		up = 1
	}
	listens := e.listens.Load()
	ps := e.pool.Stat()
	batches := e.claims.batches.Load() + e.finishes.batches.Load() + e.lookups.batches.Load()
	batched := e.claims.batched.Load() + e.finishes.batched.Load() + e.lookups.batched.Load()
	ms := []driver.Metric{
		{Name: "postgres_listener_up", Help: "1 while the LISTEN session for cross-node wake-ups is up, 0 while waiters poll.", Value: up},
		{Name: "postgres_listener_reconnects_total", Help: "LISTEN sessions opened after the first (each one a reconnect).", Value: float64(listens - min(listens, 1)), Counter: true},
		{Name: "postgres_notify_flushes_total", Help: "NOTIFY statements sent to wake waiters on other nodes (each carries many keys).", Value: float64(e.flushes.Load()), Counter: true},
		{Name: "postgres_notify_errors_total", Help: "NOTIFY statements that failed (waiters elsewhere fall back to polling).", Value: float64(e.flushErrors.Load()), Counter: true},
		{Name: "postgres_local_waiters", Help: "Keys this node's waiters watch.", Value: float64(e.hub.count())},
		{Name: "postgres_pool_acquired_conns", Help: "Pool connections in use now.", Value: float64(ps.AcquiredConns())},
		{Name: "postgres_pool_total_conns", Help: "Pool connections open now.", Value: float64(ps.TotalConns())},
		{Name: "postgres_batches_total", Help: "Statements or transactions sent for two or more concurrent calls at once (first claims, finishes, replay reads).", Value: float64(batches), Counter: true},
		{Name: "postgres_batched_calls_total", Help: "Calls those batches carried (divided by postgres_batches_total: the mean batch size).", Value: float64(batched), Counter: true},
		{Name: "postgres_batch_failures_total", Help: "Batches that failed (a server error, a lost reply); their calls went on one by one.", Value: float64(e.batchFailures.Load()), Counter: true},
	}
	return append(ms, e.durabilityMetrics()...)
}

// durabilityMetrics are the figures of what survives a failover (syncrep.go), as the engine
// read them last (every second).
func (e *engine) durabilityMetrics() []driver.Metric {
	r := e.repl.Load()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	return []driver.Metric{
		{Name: "postgres_sync_standby_up", Help: "1 while synchronous_standby_names is set and a synchronous standby is streaming (pg_stat_replication, as this node read it in the last second); 0 otherwise, also when the role may not read pg_stat_replication. Alert on 0: commits then wait, or, with asynchronous replication, a failover can lose them.", Value: b(r.standbyUp() && r.visible)},
		{Name: "postgres_sync_standby_configured", Help: "1 while synchronous_standby_names is set on the server.", Value: b(r.err == nil && strings.TrimSpace(r.standbyNames) != "")},
		{Name: "postgres_synchronous_commit", Help: "synchronous_commit of the engine's sessions: 0 off, 1 local, 2 remote_write, 3 on, 4 remote_apply (-1 unknown). Below 3 a failover can lose acknowledged receipts.", Value: r.syncCommitLevel()},
		{Name: "postgres_primary", Help: "1 while the engine's sessions are on a primary (pg_is_in_recovery is false).", Value: b(r.err == nil && r.primary)},
		{Name: "postgres_replication_visible", Help: "1 if the engine's role may read pg_stat_replication's details (superuser, pg_monitor or pg_read_all_stats); 0: postgres_sync_standby_up cannot tell.", Value: b(r.err == nil && r.visible)},
		{Name: "postgres_commit_check", Help: "1 if the pool's notice handler is in place (pgstore.Configure): a COMMIT whose wait for the synchronous standby was cancelled is then told, and its outcome treated as unknown.", Value: b(e.commitCheck.Load())},
		{Name: "postgres_require_sync_standby", Help: "1 if Options.RequireSyncStandby is set: claims are refused while a commit might not survive a failover.", Value: b(e.o.RequireSyncStandby)},
		{Name: "postgres_commits_unconfirmed_total", Help: "COMMITs PostgreSQL made on the primary only (it warned that the wait for the synchronous standby was cancelled); each was reported as unknown, never as durable.", Value: float64(e.unconfirmed.Load()), Counter: true},
	}
}

// checkDurability reads, at Open, whether the pool has the notice handler and the server's
// replication state, logs them, and refuses to open on a pool without the handler while the
// server has synchronous_standby_names set (ErrPoolNotConfigured), or when
// Options.RequireSyncStandby is set and a commit might not survive a failover.
func (e *engine) checkDurability(ctx context.Context) error {
	on, err := e.commitCheckOn(ctx)
	if err != nil {
		return errorf("pgstore: open: %w", err)
	}
	e.commitCheck.Store(on)
	r := e.readReplication(ctx)
	e.repl.Store(r)
	if r.err != nil {
		return errorf("pgstore: open: replication state: %w", r.err)
	}
	e.o.Logger.Info("pgstore: durability", "synchronous_commit", r.syncCommit, "synchronous_standby_names", r.standbyNames,
		"sync_standbys_streaming", r.syncUp, "replication_visible", r.visible, "primary", r.primary, "commit_check", on)
	if !on && e.requireConfigured(r) == nil {
		e.o.Logger.Warn("pgstore: the pool was built without pgstore.Configure: if synchronous_standby_names is set, claims are refused (ErrPoolNotConfigured)")
	}
	return e.requireSyncStandby()
}
