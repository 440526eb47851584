package receipts

import (
	"context"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Stats describes the store without reading its records: the settings in
// force, the engine's gauges and the counters of calls since Open. It is
// cheap (no scan, no round trip); Count counts the records.
type Stats struct {
	Retention, LeaseTTL, EpochWidth time.Duration
	// DiskBytes is the engine's disk usage: for Pebble, the store's
	// directory (the application's data in the same engine included); for
	// PostgreSQL, the schema's tables and indexes as the last Count measured
	// them (0 before the first).
	DiskBytes uint64
	// LastGC is the last garbage collection (zero if none since Open).
	LastGC GCStats

	// Waiters is the number of claims waiting now for another caller's
	// attempt (WaitForResult, WaitAtMost, Do).
	Waiters int64

	// Counters since Open.
	Claims, Replays, Takeovers, Commits, Fails, Releases, Abandons, Conflicts, Mismatches uint64
	// ReplayCacheHits counts the replays, mismatches and lookups answered
	// from the replay cache (Options.ReplayCacheSize) without reading the
	// engine. ReplayCacheEntries is what it holds now, and ReplayCacheBytes
	// the memory it takes: its table and the chunks its entries are written
	// in, at most Options.ReplayCacheSize once full.
	ReplayCacheHits    uint64
	ReplayCacheEntries int
	ReplayCacheBytes   int64
}

// Stats returns the store's settings, gauges and counters. It reads no
// record and does no I/O that can block. After Close it returns only the
// settings and the counters.
func (db *DB) Stats() Stats {
	s := Stats{
		Retention:  db.opts.Retention,
		LeaseTTL:   db.opts.LeaseTTL,
		EpochWidth: db.opts.EpochWidth,
		Claims:     db.hot.Claims.Load(),
		Replays:    db.hot.Replays.Load(),
		Takeovers:  db.n.takeovers.Load(),
		Commits:    db.hot.Commits.Load(),
		Fails:      db.n.fails.Load(),
		Releases:   db.n.releases.Load(),
		Abandons:   db.n.abandons.Load(),
		Conflicts:  db.hot.Conflicts.Load(),
		Mismatches: db.hot.Mismatches.Load(),
		Waiters:    db.n.waiters.Load(),
	}
	if err := db.enter(); err != nil {
		return s
	}
	defer db.exit()
	s.LastGC = *db.lastGC.Load()
	es := db.eng.Stats()
	s.DiskBytes = es.DiskBytes
	s.ReplayCacheHits, s.ReplayCacheEntries, s.ReplayCacheBytes = es.ReplayCacheHits, es.ReplayCacheEntries, es.ReplayCacheBytes
	return s
}

// Counts are the store's records counted by state, as Count finds them.
type Counts struct {
	// LiveEpochs is the number of epochs (PostgreSQL: partitions) that hold
	// records (GC has not dropped them yet).
	LiveEpochs int
	// Visible records by state; Abandoned is the part of Pending whose lease
	// has run out (outcomes to reconcile).
	Pending, Abandoned, Succeeded, Failed int64
	// Expired counts records past retention that GC has not dropped yet.
	Expired int64
	// Corrupt counts records that do not decode (Check says what is wrong
	// with them).
	Corrupt int64
}

// Count counts the stored records by state, in one pass over all of them
// (about a second per million records on Pebble), honouring ctx. A corrupt
// record is counted, not an error; an error that stops the pass (ctx, I/O)
// is returned, with zero Counts. Like Scan, it counts only what a crash
// cannot take away (on Pebble it syncs the write-ahead log up to its
// snapshot first: one fsync), so it waits for a commit whose sync is
// running.
func (db *DB) Count(ctx context.Context) (Counts, error) {
	if err := db.enter(); err != nil {
		return Counts{}, err
	}
	defer db.exit()
	if err := ctx.Err(); err != nil {
		return Counts{}, err
	}
	c, err := db.eng.Count(ctx)
	if err != nil {
		return Counts{}, err
	}
	return Counts(c), nil
}

// EngineMetrics returns the engine's own health figures (driver.Metric), for monitoring:
// on Pebble its compaction debt, read amplification, WAL and disk size; on
// PostgreSQL its listener, notifications and connection pool. Names are
// stable, in base units, without the "receipts_" prefix (package
// receiptsprom exports them). It does no I/O. After Close, or on an engine
// that reports none, it returns nil.
func (db *DB) EngineMetrics() []driver.Metric {
	if err := db.enter(); err != nil {
		return nil
	}
	defer db.exit()
	if mr, ok := db.eng.(driver.MetricsReporter); ok {
		return mr.Metrics()
	}
	return nil
}
