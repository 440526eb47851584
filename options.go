package receipts

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Defaults.
const (
	DefaultRetention = 24 * time.Hour
	DefaultLeaseTTL  = 30 * time.Second
	// DefaultCacheSize is Pebble's block cache when Options.Pebble sets
	// neither Cache nor CacheSize.
	DefaultCacheSize = 64 << 20
	// DefaultReplayCacheSize is the memory kept for recently finished
	// receipts when Options.ReplayCacheSize is zero.
	DefaultReplayCacheSize = 8 << 20
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
)

// maxClock is the latest time, in Unix ns, the store's clock reaches: a
// later Options.Now stands still here (about the year 2162), so that a last
// write plus Retention never overflows. An Options.Now before 1970 is read
// as 1970.
const maxClock = math.MaxInt64 - int64(MaxRetention)

// clockNanos is t in Unix ns, saturated to [0, maxClock].
func clockNanos(t time.Time) int64 {
	switch {
	case t.Unix() < 0:
		return 0
	case t.Unix() >= maxClock/int64(time.Second):
		return maxClock
	}
	return min(t.UnixNano(), maxClock)
}

// Limits on input. Anything larger is rejected with an error wrapping
// ErrInvalidArgument, and nothing is written.
const (
	MaxKeyPartLen     = 255     // bytes in Key.Scope and in Key.ID (each non-empty)
	MaxFingerprintLen = 1024    // bytes in a fingerprint (non-empty)
	MaxResultSize     = 1 << 20 // bytes in a result
)

// Options configure a DB. A nil *Options means all defaults. Open copies the
// options; it never changes the caller's struct.
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
	// CompactOnGC makes GC ask Pebble to compact the dropped range at once,
	// returning the disk space immediately rather than when Pebble's
	// delete-only compactions get to it.
	CompactOnGC bool
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
	Now func() time.Time
	// Pebble tunes the engine (cache, FS, ...). It is cloned, never changed.
	// Its FS lets tests use vfs.NewMem, vfs.NewCrashableMem or errorfs.
	// Levels without a filter policy get 10-bit Bloom filters, and the
	// block cache is DefaultCacheSize unless Cache or CacheSize is set.
	Pebble *pebble.Options
	// ReplayCacheSize is the memory, in bytes, for remembering recently
	// finished receipts, so that a retry of one is answered with a single
	// engine read checked against the remembered record's checksum, without
	// the key lock or decoding. Only receipts whose commit has been synced
	// are remembered, and the answer is always the one an uncached read
	// gives (a record changed or damaged on disk is read as such). Zero
	// means DefaultReplayCacheSize (32,768 receipts); negative disables it.
	// An entry takes about 200 bytes plus its key, whatever the result's
	// size (results are read from the engine); at most 64Mi entries.
	ReplayCacheSize int64
	// Logger receives the store's own diagnostics (background GC). Default
	// slog.Default().
	Logger *slog.Logger
	// BeforeReplay, if set, runs before a stored result is exposed to a
	// caller (Claim and Do replays, Lookup). Re-check the caller's current
	// authorization there: if it returns an error, that error is returned
	// and nothing is exposed.
	BeforeReplay func(ctx context.Context, r *Receipt) error
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
	if o.ReplayCacheSize == 0 {
		o.ReplayCacheSize = DefaultReplayCacheSize
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
	}
	return validateWidth(o.EpochWidth, o.Retention)
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

// pebbleOptions returns the engine options: a clone of the caller's, with
// Bloom filters on every level that has none.
func (o *Options) pebbleOptions() *pebble.Options {
	var po *pebble.Options
	if o.Pebble != nil {
		po = o.Pebble.Clone()
	} else {
		po = &pebble.Options{}
	}
	if po.Filters != nil { // Clone is shallow: never add to the caller's map
		filters := make(map[string]pebble.FilterPolicy, len(po.Filters)+1)
		for k, v := range po.Filters {
			filters[k] = v
		}
		po.Filters = filters
	}
	for i := range po.Levels {
		if po.Levels[i].FilterPolicy == nil {
			po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		}
	}
	if po.Cache == nil && po.CacheSize == 0 {
		// Pebble's 8 MiB default is all taken by its memtable reservations,
		// which leaves retries no block cache at all (bench/: 0% hits, every
		// replay a pread and a decompression).
		po.CacheSize = DefaultCacheSize
	}
	if po.FS == nil {
		// Set explicitly: left nil, EnsureDefaults wraps it in a disk-health
		// checker whose goroutine only DB.Close stops, which would leak when
		// Open fails before the engine is up (a locked directory, say).
		po.FS = vfs.Default
	}
	if po.Logger == nil && po.LoggerAndTracer == nil {
		po.Logger = pebbleLogger{o.Logger}
	} else if po.Logger != nil {
		po.Logger = failStopLogger{po.Logger}
	}
	po.EnsureDefaults()
	return po
}

// pebbleLogger sends Pebble's messages to the store's slog.Logger. Fatalf
// keeps Pebble's fail-stop behaviour: Pebble calls it when it can no longer
// guarantee durability (a failed WAL sync), and the process exits; a restart
// recovers from the WAL. An Options.Pebble.Logger replaces it, wrapped in
// failStopLogger.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error("pebble: fatal: " + fmt.Sprintf(format, args...))
	os.Exit(1)
}

// failStopLogger wraps an application's Pebble logger so that Fatalf never
// returns. Pebble reports a failed WAL write or sync only through Fatalf;
// if it returns, Pebble goes on as if the batch were durable, and the store
// would acknowledge a claim or a receipt that a power loss takes away. So
// after the application's Fatalf (which may exit, panic, or just log), the
// calling goroutine panics.
type failStopLogger struct{ pebble.Logger }

func (l failStopLogger) Fatalf(format string, args ...any) {
	l.Logger.Fatalf(format, args...)
	panic(fmt.Sprintf("pebble: fatal: "+format, args...))
}
