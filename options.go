package receipts

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/internal/pebbleengine"
)

// Defaults.
const (
	DefaultRetention = 24 * time.Hour
	DefaultLeaseTTL  = 30 * time.Second
	// DefaultCacheSize is Pebble's block cache when Options.Pebble sets
	// neither Cache nor CacheSize.
	DefaultCacheSize = pebbleengine.DefaultCacheSize
	// DefaultReplayCacheSize is the memory kept for recently finished
	// receipts when Options.ReplayCacheSize is zero.
	DefaultReplayCacheSize = 8 << 20
)

// Options configure a DB. A nil *Options means all defaults. Open copies the
// options; it never changes the caller's struct. Pebble, CompactOnGC and
// ReplayCacheSize configure the Pebble engine (Open); OpenEngine, for other
// engines, rejects them unless zero.
type Options struct {
	// Retention is how long a receipt, or an abandoned claim, stays visible
	// after its last write. Default 24h.
	Retention time.Duration
	// LeaseTTL is how long a claim's lease lasts without renewal. Default
	// 30s; must be less than Retention.
	LeaseTTL time.Duration
	// GCInterval is how often background GC runs. Zero means the default
	// (the epoch width, at most one hour); negative disables background GC
	// (call DB.GC yourself).
	GCInterval time.Duration
	// EpochWidth is the width of the time partitions records are kept in.
	// It is used only when the store is created (default Retention/4) and
	// persisted; later opens use the stored width.
	EpochWidth time.Duration
	// CompactOnGC makes GC ask Pebble to compact the dropped range at once,
	// returning the disk space immediately rather than when Pebble's
	// delete-only compactions get to it.
	CompactOnGC bool
	// Now is the clock. Default time.Now. Tests inject a fake one. While a
	// store is open its time never goes backwards: a clock that jumps back
	// is treated as standing still until it catches up. Across a restart it
	// resumes no earlier than the last Close or deletion, and after a crash
	// no earlier than the start of the newest epoch on disk; a receipt that
	// had just expired may then be visible again until it expires by the
	// restarted clock (retention only ever runs longer, never shorter).
	// With OpenEngine, nil means the engine's own clock (PostgreSQL: the
	// database's).
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
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

func (o *Options) validate() error {
	switch {
	case o.Retention < 0:
		return fmt.Errorf("%w: negative Retention %s", ErrInvalidOptions, o.Retention)
	case o.LeaseTTL < 0:
		return fmt.Errorf("%w: negative LeaseTTL %s", ErrInvalidOptions, o.LeaseTTL)
	case o.EpochWidth < 0:
		return fmt.Errorf("%w: negative EpochWidth %s", ErrInvalidOptions, o.EpochWidth)
	case o.LeaseTTL >= o.Retention:
		return fmt.Errorf("%w: LeaseTTL %s must be less than Retention %s", ErrInvalidOptions, o.LeaseTTL, o.Retention)
	}
	return nil
}
