// Package driver is the interface a storage engine implements under package receipts, as
// database/sql/driver is under database/sql. The root package holds the contract (Key
// validation, Receipt, Lease, claim options and waiting, Do's outcome policy, renewal,
// BeforeReplay, counters) and calls an Engine for everything that touches storage: the atomic
// claim, reads, fenced writes, time, wake-ups and retention.
//
// Applications do not use this package; engine packages do (the Pebble engine behind
// receipts.Open, pgstore behind pgstore.Open). An engine is handed to receipts.OpenEngine.
package driver

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"strconv"
	"time"
)

// Sentinel errors an engine returns (wrapped or not). The root package re-exports them under
// the same names (receipts.ErrLeaseLost is ErrLeaseLost), so errors.Is works either way.
var (
	// ErrLeaseLost: the token is stale (another attempt took over, or the record is
	// gone/expired). Engines return it from every fenced write, having written nothing.
	ErrLeaseLost = errors.New("receipts: lease lost")

	// ErrCorrupt marks stored bytes that cannot be decoded (a record or the store's meta
	// data); never reported as "absent".
	ErrCorrupt = errors.New("receipts: corrupt record")

	// ErrUnknownFormat: the store was written in a format this version does not know.
	ErrUnknownFormat = errors.New("receipts: unknown store format")

	// ErrClosed: Claim was called, or decided, once Config.Closing reported true.
	ErrClosed = errors.New("receipts: closed")

	// ErrLocked: an embedded engine's directory is held by another process (or another
	// store in this process).
	ErrLocked = errors.New("receipts: store is locked by another process (use the service's admin endpoint, or open a checkpoint)")

	// ErrEffectEnded: an effect (Effects.FinishWith, or the Pebble engine's batch) ended
	// the engine's unit of atomic work itself: it committed or rolled back the
	// transaction with a statement, or committed the batch. What it wrote before may be
	// durable without the receipt, so the outcome is unknown. Engines return it, having
	// recorded nothing; the root abandons the claim and wraps it in
	// receipts.ErrOutcomeUnknown, and that lease's Release and Forget return it too (freeing
	// the key could run the effect twice). Applications match it with errors.Is.
	ErrEffectEnded = errors.New("receipts: the effect ended the unit of work itself")
)

// State of a record.
type State uint8

// Record states (the values of receipts.State).
const (
	Pending   State = 1
	Succeeded State = 2
	Failed    State = 3
)

// Key is {Scope, ID}, already validated by the root (non-empty, <= 255 bytes each).
type Key struct{ Scope, ID string }

// String formats k for messages, quoting each part (as receipts.Key does).
func (k Key) String() string { return strconv.Quote(k.Scope) + "/" + strconv.Quote(k.ID) }

// Record is a stored record as the engine sees it. All times are by the ENGINE's clock
// (Pebble: Config.Now with a never-backwards high-water mark; PostgreSQL: the database clock,
// or Config.Now when a test injects one), in the location the receipts are reported in.
type Record struct {
	Key            Key
	Fingerprint    []byte // 1..MaxFingerprintLen bytes
	State          State
	Result         []byte // nil while Pending; non-nil (maybe empty) once finished
	Attempts       uint32 // 1, +1 per takeover
	Token          uint64 // store-wide unique, larger than every token handed out before it
	CreatedAt      time.Time
	UpdatedAt      time.Time // last write; the record is visible while now < UpdatedAt + Retention
	LeaseExpiresAt time.Time // Pending only: the lease is live while now < LeaseExpiresAt
	ExpiresAt      time.Time // UpdatedAt + Retention
	// Trace is the trace context stored with a finished record (at most MaxTrace bytes, opaque
	// to the engine: TraceOf of the finishing call's context), or nil.
	Trace []byte
	// Journal is the record's step journal (Journals.Journal: opaque to the engine, written
	// by the root), or nil. Every write of the record keeps it (Renew, Finish, Abandon, a
	// takeover, Release) until the record is deleted.
	Journal []byte
}

// MaxTrace bounds the trace context a record stores (Record.Trace).
const MaxTrace = 256

type traceKey struct{}

// WithTrace returns a copy of ctx that carries trace (at most MaxTrace bytes): an engine's
// Finish, and the engine packages' own ways of finishing a lease, store it with the finished
// record (Record.Trace). A longer trace is not stored.
func WithTrace(ctx context.Context, trace []byte) context.Context {
	if len(trace) == 0 || len(trace) > MaxTrace {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, trace)
}

// TraceOf returns the trace context WithTrace put in ctx, or nil.
func TraceOf(ctx context.Context) []byte {
	t, _ := ctx.Value(traceKey{}).([]byte)
	return t
}

// Outcome of a claim.
type Outcome uint8

// Claim outcomes.
const (
	Claimed    Outcome = iota + 1 // a new record: Record is the claim (Attempt 1); the caller holds the lease
	TookOver                      // an abandoned/expired-lease Pending record was taken over: new token, Attempts+1, Recovered
	Replay                        // a finished record (Succeeded/Failed): Record holds it, result included; nothing written
	Mismatch                      // the visible record has another fingerprint (any state); nothing written
	InProgress                    // another holder's lease is live; Record holds it (LeaseExpiresAt, UpdatedAt); nothing written
	Expired                       // the key was used, its receipt is past retention: a tombstone (Record: Key, UpdatedAt, ExpiresAt); nothing written
)

// ClaimRequest asks for one atomic claim decision (pure rules: internal/machine.Claim).
type ClaimRequest struct {
	Key         Key
	Fingerprint []byte
	LeaseTTL    time.Duration // lease length for this claim (> 0, < Retention)
}

// ClaimResult is what the engine decided, and its clock at the decision.
type ClaimResult struct {
	Outcome Outcome
	Record  Record
	Now     time.Time
	// Shared: Record's Fingerprint and Result alias memory the engine
	// keeps (and other calls read): the root copies them before handing
	// them out. Engines that hand out their own copies leave it false.
	// Either way, a Claimed record's Fingerprint may be the request's own
	// slice (the Pebble engine's is): a caller that changes that slice
	// afterwards and keeps the record copies it first.
	Shared bool
}

// Filter selects records for Scan (the root validates it).
type Filter struct {
	Scope     string // "" = all scopes
	State     State  // 0 = any
	Abandoned bool   // Pending with the lease run out
	Limit     int    // 0 = no limit
}

// GCStats is what one retention pass did.
type GCStats struct {
	At            time.Time
	EpochsDropped int // epochs (Pebble) or partitions (PostgreSQL) dropped
	BytesFreed    uint64
	Writes        int // writes issued: O(epochs), never O(records)
	// TombstoneEpochsDropped counts the epochs (partitions) of tombstone
	// markers dropped, past Retention + TombstoneWindow.
	TombstoneEpochsDropped int
	// MarkersWritten is the tombstone markers GC wrote for the records it dropped (Pebble:
	// one ingested sstable of MarkerBytes bytes); zero while tombstones are off.
	MarkersWritten int
	MarkerBytes    int64
	Compacted      bool // Pebble CompactOnGC: the dropped range was compacted at once
	Duration       time.Duration
}

// Stats are an engine's gauges for receipts.DB.Stats, read without a scan and without a
// round trip to a server. Counters of calls are kept by the root; record counts are Count's.
type Stats struct {
	// DiskBytes is the engine's disk usage (Pebble: the store's directory; PostgreSQL: the
	// schema's tables and indexes as measured by the last Count, 0 before the first).
	DiskBytes uint64
	// The replay cache (Pebble): hits since open, entries and bytes held now.
	ReplayCacheHits    uint64
	ReplayCacheEntries int
	ReplayCacheBytes   int64
}

// Counts are what one pass over the stored records finds (receipts.DB.Count).
type Counts struct {
	LiveEpochs int // epochs (partitions) holding records
	// Visible records by state; Abandoned is the part of Pending whose lease has run out.
	Pending, Abandoned, Succeeded, Failed int64
	Expired                               int64 // records past retention not reclaimed yet
	Corrupt                               int64 // records that do not decode
}

// Config is what the root hands an engine's constructor (see receipts.OpenEngine): the
// options every engine shares, defaulted and validated once by the root.
type Config struct {
	Retention time.Duration // > 0
	LeaseTTL  time.Duration // default lease length, 0 < LeaseTTL < Retention
	// StoredRetention and StoredLeaseTTL say that the option was left zero:
	// an existing store's recorded value takes the place of the default.
	// An engine records the Retention and LeaseTTL in force with the store
	// (so that offline tools see what the service sees) and reports them in
	// Config().
	StoredRetention, StoredLeaseTTL bool
	// TombstoneWindow is how long after a record's retention ends its key
	// stays marked as used (a Claim of it answers Expired): > 0 keeps
	// tombstones, < 0 keeps none. Zero (the option left zero, and
	// StoredTombstoneWindow set) means the store's recorded window, or
	// DefaultTombstoneWindow(Retention in force) for a store that records
	// none. An engine that keeps no tombstones (it does not implement
	// Tombstones) leaves it as given; the root reports tombstones as off.
	TombstoneWindow       time.Duration
	StoredTombstoneWindow bool
	// EpochWidth is the width of the time partitions records are kept in, for a store
	// being created (> 0, default Retention/4); an existing store keeps its own (Engine.Config
	// reports the one in force).
	EpochWidth time.Duration
	// Now is the clock: nil means the engine's own (the process clock for Pebble, the
	// database's for PostgreSQL); tests inject one.
	Now    func() time.Time
	Logger *slog.Logger // never nil
	// Check validates the settings in force (never nil): Retention and
	// LeaseTTL with the recorded values put in, EpochWidth the store's (the
	// stored one for an existing store). An engine calls it once it has read
	// its store, before writing anything, and if it fails returns its error
	// (wrapped) and changes nothing.
	Check func(inForce Config) error
	// Closing reports whether the DB's Close has begun (it reads the DB's
	// close gate, one atomic load; nil means never). Once it reports true,
	// Claim hands out no new lease: an engine calls it where the claim
	// decides, AFTER it has taken the claim's time and BEFORE the claim's
	// write is durable or visible (Pebble: under the key lock, after reading
	// the store's time; PostgreSQL: after the claim statement answered,
	// before its transaction commits), and if it reports true writes nothing
	// and returns ErrClosed. So a claim admitted before Close but deciding
	// past its start writes nothing, and a claim whose time was taken after
	// Close began is never handed out. Fenced writes of leases already
	// handed out go on.
	Closing func() bool
}

// TombstoneFactor is the default tombstone window in Retentions: a key
// stays marked as used for TombstoneFactor × Retention after its receipt's
// retention ends.
const TombstoneFactor = 7

// MaxTombstoneWindow is the longest tombstone window: 100 years, as
// receipts.MaxRetention.
const MaxTombstoneWindow = 100 * 365 * 24 * time.Hour

// DefaultTombstoneWindow is the tombstone window for a store whose options
// and meta data give none: TombstoneFactor × retention, at most
// MaxTombstoneWindow.
func DefaultTombstoneWindow(retention time.Duration) time.Duration {
	if retention > MaxTombstoneWindow/TombstoneFactor {
		return MaxTombstoneWindow
	}
	return TombstoneFactor * retention
}

// Tombstone is what an engine keeps of a key whose record is past
// retention, for Config.TombstoneWindow: the key, and when its record was
// last written. Never the fingerprint or the result.
type Tombstone struct {
	Key Key
	// UsedAt is the record's last write (its UpdatedAt).
	UsedAt time.Time
	// ExpiredAt is when the record's retention ended (UsedAt + Retention).
	ExpiredAt time.Time
	// Until is when the tombstone ends (ExpiredAt + TombstoneWindow): from
	// then on a claim of the key is a new action.
	Until time.Time
}

// Tombstones is implemented by an engine that keeps tombstones: its Claim
// answers Expired for a key whose record is past retention but within the
// tombstone window. The markers are reclaimed like records, by dropping
// whole epochs (partitions) in GC.
type Tombstones interface {
	// Tombstone returns k's live tombstone at the engine's time; found is
	// false if k has a visible record, or no tombstone in force.
	Tombstone(ctx context.Context, k Key) (t Tombstone, found bool, err error)
	// ScanTombstones yields the live tombstones of scope ("" = every
	// scope), durable only, at most limit of them (0 = no limit).
	ScanTombstones(ctx context.Context, scope string, limit int) iter.Seq2[Tombstone, error]
}

// Engine is what a storage engine supplies. Every method is safe for concurrent use, honours ctx,
// and exposes nothing that is not durable (DESIGN rule 1; Pebble DoBatch's unsynced claim aside).
// Fenced writes take the holder's token and return ErrLeaseLost (writing nothing) if the visible
// record is not Pending with that token. Fencing is by token, not by time: a holder whose lease ran
// out but that nobody took over may still renew/commit. The root calls no method after Close.
type Engine interface {
	// Name is the engine's name for logs and metrics ("pebble", "postgres").
	Name() string
	// Config returns the settings in force: the Config the engine was opened with, with the
	// epoch width the store was created with.
	Config() Config
	// Now is the engine's clock (never runs backwards).
	Now(ctx context.Context) (time.Time, error)
	// Claim decides atomically, for exactly one winner among concurrent claimers on every node.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Lookup returns the visible record of k (any state), found=false if none.
	Lookup(ctx context.Context, k Key) (rec Record, found bool, now time.Time, err error)
	// Renew extends the lease to now + ttl.
	Renew(ctx context.Context, k Key, token uint64, ttl time.Duration) (Record, error)
	// Finish records Succeeded or Failed with result (synced/committed before it returns).
	Finish(ctx context.Context, k Key, token uint64, state State, result []byte) (Record, error)
	// Release: no effect happened. If the record has Attempts == 1 and was never taken over
	// (recovered == false), the record is deleted (the next claim starts afresh). If recovered is
	// true (this lease took over an unknown outcome), the record is KEPT as an abandoned claim
	// (Pending, lease ended now, same fingerprint and attempts) so the next claim is Recovered too.
	Release(ctx context.Context, k Key, token uint64, recovered bool) error
	// Forget deletes the record (fenced): the caller reconciled and no earlier effect happened.
	Forget(ctx context.Context, k Key, token uint64) error
	// Abandon ends the lease now, keeping the claim: the next claim takes over (Recovered).
	Abandon(ctx context.Context, k Key, token uint64) error
	// Watch returns a channel that is signalled (closed or sent to) after a later
	// Finish/Release/Abandon/Forget of k by ANY node commits; done unregisters. Wake-ups are hints:
	// the waiter re-reads (it calls Claim again). The root registers a watch, re-claims once, and
	// only then waits (so a change between its read and its registration is not missed), bounded by
	// the holder's LeaseExpiresAt, a re-check period and ctx.
	Watch(k Key) (c <-chan struct{}, done func())
	// Scan iterates visible records matching f (operator use), durable only.
	Scan(ctx context.Context, f Filter) iter.Seq2[Record, error]
	// Stats reports the engine's gauges: cheap, no scan, no I/O that can block.
	Stats() Stats
	// Count counts the stored records (a pass over all of them, durable ones only).
	Count(ctx context.Context) (Counts, error)
	// GC reclaims space of records past retention by dropping whole epochs/partitions.
	GC(ctx context.Context) (GCStats, error)
	// Secret is a per-store random secret (created with the store, stable forever): ProviderKey is
	// HMAC-SHA256(secret, key) computed by the root.
	Secret() []byte
	// Close releases the engine's resources (background goroutines, listener connections).
	Close() error
}

// Checker is implemented by an engine that can check its store's integrity
// (receipts.DB.Check). An engine without it makes Check return
// receipts.ErrUnsupported.
type Checker interface {
	// Check reads every stored record and the store's own data (meta,
	// counters) from one consistent view, and reports what is wrong. A
	// problem found is a Problem, not an error; the error is for what stops
	// the check (ctx, I/O).
	Check(ctx context.Context) (CheckReport, error)
}

// CheckReport is what Checker.Check found.
type CheckReport struct {
	Records int // record keys (rows) read
	Epochs  int // distinct epochs (partitions) holding records
	Expired int // records past retention, waiting for GC
	// EpochWidth is the store's as its meta records it (0 if unreadable).
	EpochWidth time.Duration
	// GCFloor: epochs below it were dropped by GC. TokenCeiling: no token
	// at or above it was handed out.
	GCFloor, TokenCeiling uint64
	Problems              []Problem
}

// Problem is one thing wrong in a store.
type Problem struct {
	// Key names what is wrong: a record's key as Key.String formats it, a
	// stored key that does not parse (Go-quoted), or a part of the store
	// ("meta", "token ceiling", "gc floor", a table).
	Key string
	// Epoch is the epoch (partition) the record is stored in; -1 if the
	// problem is not in one.
	Epoch int64
	// What is wrong, for people.
	What string
}

// AttemptTaker is implemented by an Engine that can take over one given attempt: what
// receipts.DB.TakeOver (and the Reconciler) use to settle exactly the abandoned claim an
// operator or Scan listed, with no other attempt in between. An engine without it makes
// TakeOver return receipts.ErrUnsupported.
type AttemptTaker interface {
	// TakeOver decides atomically, as Claim does, but only for the attempt with token: if the
	// visible record of req.Key is Pending with that token and its lease has run out, it is
	// taken over (Outcome TookOver: a new token, Attempts+1, the lease now + req.LeaseTTL, the
	// record's own fingerprint kept; req.Fingerprint is ignored) and synced. If it is that
	// attempt but its lease is live, Outcome InProgress with the record, nothing written. Any
	// other record (another token, finished, gone): ErrLeaseLost, nothing written. Like Claim,
	// it returns ErrClosed once Config.Closing is closed.
	TakeOver(ctx context.Context, req ClaimRequest, token uint64) (ClaimResult, error)
}

// Effects is implemented by an engine that commits an application's own
// writes together with a receipt, in the engine's unit of atomic work: on
// Pebble the *pebble.Batch that carries the receipt, on PostgreSQL a pgx.Tx
// that holds the lease's row. It is how receipts.Lease.Stage (and with it
// the HTTP and MCP front ends) commits an effect with the receipt on every
// engine, as River's Driver[TTx] carries the caller's transaction type. An
// engine without it makes a commit with staged effects return
// receipts.ErrUnsupported.
type Effects interface {
	// FinishWith is Finish, with effect called first to write into tx, the
	// engine's unit of atomic work, fenced by token: the effect's writes
	// and the finished record commit together, or neither does. If the
	// lease is lost, effect is not called and nothing is written
	// (ErrLeaseLost); if effect returns an error, nothing is written, the
	// lease is still held, and that error is returned (wrapped). tx is
	// valid only while effect runs.
	FinishWith(ctx context.Context, k Key, token uint64, state State, result []byte,
		effect func(ctx context.Context, tx any) error) (Record, error)
}

// Journals is implemented by an engine that keeps a step journal with a claim: what
// receipts.Lease.Step records each finished step in. An engine without it makes Step return
// receipts.ErrUnsupported.
//
// The journal is bytes the root encodes (and seals per scope); the engine stores them with
// the record and hands them back in Record.Journal from Claim (a takeover), TakeOver and
// Lookup (Scan need not). Every later write of the record keeps them: Renew, Finish, Abandon, a takeover.
// Release keeps a record that has a journal, as it keeps one that was taken over (abandoned,
// so the next claim takes it over and resumes): the steps it records happened. Forget
// deletes the record with its journal, and so do retention, GC and erasure.
type Journals interface {
	// Journal replaces the journal of k's Pending record held by token, durably (synced or
	// committed) before it returns, leaving the lease's expiry as it is. If the lease is
	// lost, it writes nothing and returns ErrLeaseLost. effect, if not nil, writes into the
	// engine's unit of atomic work as for Effects.FinishWith (the Pebble batch, the pgx.Tx):
	// its writes and the journal commit together or not at all; if it fails, nothing is
	// written and its error is returned (wrapped); if it ended the unit of work itself, the
	// error wraps ErrEffectEnded.
	Journal(ctx context.Context, k Key, token uint64, journal []byte,
		effect func(ctx context.Context, tx any) error) (Record, error)
}

// MaxJournal bounds a journal an engine must store (receipts' limits on steps keep the
// root's journals below it).
const MaxJournal = 2 << 20

// LeaseInfo is what identifies a lease to its engine: what receipts.Lease.Raw hands an engine
// package's own ways of finishing a lease (pgstore.CommitTx).
type LeaseInfo struct {
	Key       Key
	Token     uint64
	Attempts  uint32
	Recovered bool
	// Seal, if not nil, is what the engine package stores in place of a result it writes
	// itself: receipts' Options.Keyring encrypts results, and Seal(ctx, state, result)
	// returns the bytes to store for result recorded as state.
	Seal func(ctx context.Context, state State, result []byte) ([]byte, error)
}

// Metric is one of an engine's own health figures (package receiptsprom exports each as
// receipts_<Name>).
type Metric struct {
	// Name is snake_case, in base units with the unit as suffix ("_bytes", "_seconds") and
	// "_total" for a counter, without the "receipts_" prefix: "pebble_wal_bytes".
	Name string
	// Help says what it measures, in one sentence.
	Help string
	// Value is the figure now.
	Value float64
	// Counter: a count since the engine was opened, that only grows; otherwise a gauge.
	Counter bool
}

// MetricsReporter is implemented by engines that report health figures of their own
// (Pebble: compaction debt, WAL size; PostgreSQL: listener reconnects, notify flushes).
// Metrics must be cheap (no I/O) and safe for concurrent use; it returns the same names, in
// the same order, on every call.
type MetricsReporter interface {
	Metrics() []Metric
}

// LocalClock is implemented by an engine whose clock is read without I/O (Pebble: the
// configured clock with its never-backwards high-water mark). The root compares keys' mint
// times (receipts.KeyTime) with it; an engine without it is compared with the process's clock.
type LocalClock interface {
	// LocalNow returns the engine's time, as Engine.Now would, without I/O.
	LocalNow() time.Time
}
