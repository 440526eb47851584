package pebbleengine

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// DefaultCacheSize is Pebble's block cache when the Pebble options set
// neither Cache nor CacheSize.
const DefaultCacheSize = 64 << 20

// DefaultLBaseMaxBytes is Pebble's LBaseMaxBytes when the Pebble options
// leave it zero: 8 MiB, against Pebble's 64 MiB. Operation keys are spread
// over the key space, so every compaction of L0 into the base level
// rewrites most of it; while a store is under a few hundred MB, the base
// level is L6 itself, and a 64 MiB target lets it take every compaction.
// With 1M new keys written 64-way (bench/cmd/lsmload), 8 MiB cut the
// compactions' writes from 2.1 GB to 0.63 GB and the CPU per key from 77
// to 49 µs.
const DefaultLBaseMaxBytes = 8 << 20

// pebbleOptions returns the engine options: a clone of the caller's, with
// Bloom filters on every level that has none, sstables split at epoch
// boundaries (for GC) unless the caller set a span policy, and
// DefaultLBaseMaxBytes unless the caller set LBaseMaxBytes.
func pebbleOptions(opts *pebble.Options, logger *slog.Logger) *pebble.Options {
	var po *pebble.Options
	if opts != nil {
		po = opts.Clone()
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
	if po.Experimental.SpanPolicyFunc == nil {
		po.Experimental.SpanPolicyFunc = epochSpans
	}
	if po.Cache == nil && po.CacheSize == 0 {
		// Pebble's 8 MiB default is all taken by its memtable reservations,
		// which leaves retries no block cache at all (bench/: 0% hits, every
		// replay a pread and a decompression).
		po.CacheSize = DefaultCacheSize
	}
	if po.LBaseMaxBytes == 0 {
		po.LBaseMaxBytes = DefaultLBaseMaxBytes
	}
	if po.FS == nil {
		// Set explicitly: left nil, EnsureDefaults wraps it in a disk-health
		// checker whose goroutine only DB.Close stops, which would leak when
		// Open fails before the engine is up (a locked directory, say).
		po.FS = vfs.Default
	}
	if po.Logger != nil || po.LoggerAndTracer == nil {
		po.Logger = Logger(po.Logger, logger)
	}
	po.EnsureDefaults()
	return po
}

// Logger returns the Pebble logger of a Pebble database of this module
// (the engine's, the intents journal's): user wrapped in failStopLogger,
// or, when user is nil, Pebble's messages sent to l.
func Logger(user pebble.Logger, l *slog.Logger) pebble.Logger {
	if user != nil {
		return failStopLogger{user}
	}
	return pebbleLogger{l}
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
