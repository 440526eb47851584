package receipts

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/observe"
)

// Defaults.
const (
	DefaultRetention = 24 * time.Hour
	DefaultLeaseTTL  = 30 * time.Second
)

// Bounds on the duration options. Open refuses anything outside them with
// ErrInvalidOptions and changes nothing on disk: past them the store's time
// arithmetic would overflow (every record expired the moment it is written)
// or a lookup would probe an unbounded number of epochs.
const (
	// MaxRetention is the longest Options.Retention: 100 years. It bounds
	// EpochWidth and GCInterval too.
	MaxRetention = 100 * 365 * 24 * time.Hour
	// MaxEpochsPerRetention bounds how many epochs a lookup probes: the
	// epoch width must be at least Retention/MaxEpochsPerRetention
	// (rounded up), whether given now or stored when the store was created.
	MaxEpochsPerRetention = 1024
	// MinGCInterval is the shortest positive Options.GCInterval.
	MinGCInterval = time.Millisecond
	// MaxTombstoneWindow is the longest Options.TombstoneWindow: 100 years.
	MaxTombstoneWindow = driver.MaxTombstoneWindow
	// MaxTombstoneEpochs bounds how many epochs of tombstone markers a
	// lookup of a key without a record probes: TombstoneWindow must be at
	// most MaxTombstoneEpochs epoch widths.
	MaxTombstoneEpochs = driver.TombstoneFactor * MaxEpochsPerRetention
)

// DefaultTombstoneWindow is the tombstone window of a store whose options
// and meta data give none: 7 × the Retention in force (driver.TombstoneFactor),
// at most MaxTombstoneWindow. At the default Retention of 24h that is 7
// days: Kafka's default log retention, and longer than SQS's default
// message retention (4 days), so a message redelivered from a queue, or
// replayed from a log, after its receipt expired is still recognised as
// used. A marker costs about 30 bytes plus the key (no fingerprint, no
// result), so keeping markers 8 × as long as receipts costs less than the
// receipts themselves for any result over a few dozen bytes.
func DefaultTombstoneWindow(retention time.Duration) time.Duration {
	return driver.DefaultTombstoneWindow(retention)
}

// MaxRetention is machine's bound: both fail to compile unless equal.
var (
	_ [int64(MaxRetention) - machine.MaxRetention]struct{}
	_ [machine.MaxRetention - int64(MaxRetention)]struct{}
)

// Options configure a DB. A nil *Options means all defaults. Open copies the
// options; it never changes the caller's struct. The options here are
// every engine's; an engine package adds its own beside them
// (pebblestore.Options, pgstore.Options).
type Options struct {
	// Retention is how long a receipt, or an abandoned claim, stays visible
	// after its last write; at most MaxRetention (100 years). The store
	// records it: zero means the value recorded in an existing store (so
	// offline tools see what the service sees), or 24h for a new one; a
	// different value is used and recorded.
	Retention time.Duration
	// LeaseTTL is how long a claim's lease lasts without renewal; it must
	// be positive and less than Retention. Recorded like Retention: zero
	// means the recorded value, or 30s for a new store.
	LeaseTTL time.Duration
	// TombstoneWindow is how long after a receipt's (or an abandoned
	// claim's) retention ends its key stays marked as used: a Claim, Do or
	// DoBatch of it then returns ErrExpired, whatever the fingerprint,
	// instead of running the action again ("this key was used; its receipt
	// is gone"), and Lookup an error matching both ErrNotFound and
	// ErrExpired. Only a marker of the key is kept (no fingerprint, no
	// result), reclaimed by GC one whole epoch at a time. A claim released
	// with no effect (a first attempt's Release, NotPerformed) leaves no
	// marker. After the window the key is free: a claim is a new action.
	//
	// Zero means the value recorded in an existing store, or
	// DefaultTombstoneWindow(Retention) (7 × Retention) for a new one;
	// negative keeps no tombstones (past retention a retry is a new
	// action, as before tombstones); a different value is used and
	// recorded, like Retention. A positive window is at most
	// MaxTombstoneWindow and at most MaxTombstoneEpochs epoch widths
	// (ErrInvalidOptions otherwise). Receipts written while tombstones were
	// off leave none when the store is reopened with them on. On an engine
	// that keeps no tombstones (see DB.Options) a positive window is
	// refused with ErrUnsupported.
	TombstoneWindow time.Duration
	// KeyTime, if set, reads the mint time out of an operation key's ID
	// (UUIDv7Time, ULIDTime, or the application's own): a Claim, Do or
	// DoBatch of a key minted more than Retention + TombstoneWindow ago
	// (Retention alone with tombstones off), by the store's clock, returns
	// ErrExpired without any lookup. Keys it returns false for are looked
	// up as usual. A key must then be claimed within that time of being
	// minted. Lookup does not use it (it reports what is stored).
	KeyTime func(id string) (time.Time, bool)
	// GCInterval is how often background GC runs. Zero means the default
	// (the epoch width, between one second and one hour); negative disables
	// background GC (call DB.GC yourself); a positive value must be between
	// MinGCInterval (1ms) and MaxRetention.
	GCInterval time.Duration
	// EpochWidth is the width of the time partitions records are kept in.
	// It is used only when the store is created (default Retention/4) and
	// persisted; later opens use the stored width. It must be at most
	// MaxRetention and at least Retention/MaxEpochsPerRetention (rounded
	// up), so that a lookup probes at most 1025 epochs; a store whose
	// stored width is too narrow for a longer Retention given at a later
	// Open is refused (ErrInvalidOptions) and left as it is.
	EpochWidth time.Duration
	// Now is the clock. Default time.Now. Tests inject a fake one. Times
	// before 1970 are read as 1970, and times after about 2162 (MaxInt64 ns
	// less MaxRetention) as that limit: the store's clock saturates rather
	// than overflow. While a
	// store is open its time never goes backwards: a clock that jumps back
	// is treated as standing still until it catches up. Across a restart it
	// resumes no earlier than the last Close or deletion, and after a crash
	// no earlier than the start of the newest epoch on disk; a receipt that
	// had just expired may then be visible again until it expires by the
	// restarted clock (retention only ever runs longer, never shorter).
	// With OpenEngine, nil means the engine's own clock (PostgreSQL: the
	// database's).
	Now func() time.Time
	// Logger receives the store's own diagnostics (background GC, failed
	// writes) and one record per transition: at Info a takeover, an
	// abandoned claim, a lost lease, a retry of an expired key and a GC
	// that dropped something; at Debug every other claim, wait, finish and
	// GC (see Observer for what each carries). A key is logged as its keyed hash (Event.KeyHash),
	// never raw, unless LogKeys is set. Default slog.Default().
	Logger *slog.Logger
	// LogKeys makes the Logger's records, the texts of the store's errors
	// (which end up in logs) and DB.LogKey name keys by their scope and ID
	// instead of their keyed hash ("key#" and 24 hex digits in an error).
	// Leave it off where logs are less protected than the data (an ID can
	// carry personal data). Structured errors keep the Key itself in their
	// Key field either way (InProgressError, ExpiredError).
	LogKeys bool
	// Observer, if set, receives one event per transition (claims, waits,
	// finishes, GC): see Observer. Packages receiptsprom and receiptsotel
	// adapt it to Prometheus and OpenTelemetry; Observers combines several.
	// Nil costs nothing.
	Observer observe.Observer
	// BeforeReplay, if set, runs before a stored result is exposed to a
	// caller (Claim and Do replays, Lookup). Re-check the caller's current
	// authorization there: if it returns an error, that error is returned
	// and nothing is exposed.
	BeforeReplay func(ctx context.Context, r *Receipt) error
	// Keyring, if set, encrypts every result recorded from now on, per scope, under the
	// application's key-encryption key: recommended in production (docs/privacy.md).
	// Each scope gets a data key of its own (AES-256-GCM), which the store keeps only as
	// Keyring wrapped it; a result is bound to its key, token and state. Fingerprints,
	// states, tokens and times stay in the clear, so claims, mismatch checks, tombstones
	// and GC never decrypt; replays do, after BeforeReplay (which sees the receipt without
	// its result). Results stored before the option was set are read as they are. A DB
	// opened without it cannot read encrypted results (ErrSealed). Package keyring keeps a
	// key-encryption key in a local file. An engine that keeps no data keys refuses it
	// (ErrUnsupported). Each stored result grows by 36 bytes (the envelope's header and GCM's tag).
	Keyring Keyring
	// HashKeys stores every scope and ID as a keyed hash under the store's secret, so that
	// a copy of the store does not say who called what (docs/privacy.md). Every call still
	// takes the caller's key and answers with it; Scan and Tombstones list the stored keys
	// (the scope as given when the filter names it), and every call accepts a listed key.
	// What is lost: a scope's IDs can no longer be listed by someone who does not know
	// them, and operators see hashes. The store records it when it is created with it
	// (later opens, receiptctl's included, use it whatever this field says); a store that
	// already holds records with their keys as given refuses it (ErrInvalidOptions).
	// With it a scope or ID may not start with "\x00h" (ErrInvalidKey).
	HashKeys bool
}

// ensureDefaults fills zero fields. REQUIRES: o is the DB's own copy.
func (o *Options) ensureDefaults() {
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.EpochWidth == 0 {
		o.EpochWidth = max(o.Retention/4, time.Nanosecond)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// validate checks the options with the defaults filled in.
func (o *Options) validate() error {
	switch {
	case o.Retention <= 0 || o.Retention > MaxRetention:
		return fmt.Errorf("%w: Retention %s must be positive and at most %s", ErrInvalidOptions, o.Retention, MaxRetention)
	case o.LeaseTTL <= 0:
		return fmt.Errorf("%w: LeaseTTL %s must be positive", ErrInvalidOptions, o.LeaseTTL)
	case o.LeaseTTL >= o.Retention:
		return fmt.Errorf("%w: LeaseTTL %s must be less than Retention %s", ErrInvalidOptions, o.LeaseTTL, o.Retention)
	case o.GCInterval > 0 && (o.GCInterval < MinGCInterval || o.GCInterval > MaxRetention):
		return fmt.Errorf("%w: GCInterval %s must be negative, zero, or between %s and %s", ErrInvalidOptions, o.GCInterval, MinGCInterval, MaxRetention)
	case o.TombstoneWindow > MaxTombstoneWindow:
		return fmt.Errorf("%w: TombstoneWindow %s must be at most %s", ErrInvalidOptions, o.TombstoneWindow, MaxTombstoneWindow)
	}
	if err := validateWidth(o.EpochWidth, o.Retention); err != nil {
		return err
	}
	if o.TombstoneWindow > 0 && (o.TombstoneWindow-1)/o.EpochWidth+1 > MaxTombstoneEpochs {
		return fmt.Errorf("%w: TombstoneWindow %s is more than %d epoch widths (EpochWidth %s)", ErrInvalidOptions, o.TombstoneWindow, MaxTombstoneEpochs, o.EpochWidth)
	}
	return nil
}

// validateWidth checks an epoch width (given, or stored at creation)
// against the retention in force.
func validateWidth(width, retention time.Duration) error {
	switch {
	case width <= 0 || width > MaxRetention:
		return fmt.Errorf("%w: EpochWidth %s must be positive and at most %s", ErrInvalidOptions, width, MaxRetention)
	case (retention-1)/width+1 > MaxEpochsPerRetention:
		return fmt.Errorf("%w: EpochWidth %s is narrower than Retention/%d (Retention %s)", ErrInvalidOptions, width, MaxEpochsPerRetention, retention)
	}
	return nil
}
