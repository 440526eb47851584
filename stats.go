package receipts

import (
	"context"
	"time"
)

// Stats describes the store. Record counts come from a scan of the live
// epochs (about a second per million records); the counters count calls
// since Open.
type Stats struct {
	Retention, LeaseTTL, EpochWidth time.Duration
	// LiveEpochs is the number of epochs that hold records (GC has not
	// dropped them yet).
	LiveEpochs int
	// Visible records by state; Abandoned is the part of Pending whose lease
	// has run out (outcomes to reconcile).
	Pending, Abandoned, Succeeded, Failed int64
	// Expired counts records past retention that GC has not dropped yet.
	Expired int64
	// Corrupt counts records that do not decode.
	Corrupt int64
	// DiskBytes is the engine's disk usage (the application's data in the
	// same engine included).
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
	// engine. ReplayCacheEntries and ReplayCacheBytes are what it holds now.
	ReplayCacheHits    uint64
	ReplayCacheEntries int
	ReplayCacheBytes   int64
}

// Stats returns the store's figures. After Close it returns only the
// configuration and the counters. Like Scan, it counts only what a crash
// cannot take away: it syncs the write-ahead log up to its snapshot first
// (one fsync), so it waits for a commit whose sync is running.
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
	es, _ := db.eng.Stats(context.Background()) // the counts so far (Stats reports no errors)
	s.LiveEpochs = es.LiveEpochs
	s.Pending, s.Abandoned, s.Succeeded, s.Failed = es.Pending, es.Abandoned, es.Succeeded, es.Failed
	s.Expired, s.Corrupt, s.DiskBytes = es.Expired, es.Corrupt, es.DiskBytes
	s.ReplayCacheHits, s.ReplayCacheEntries, s.ReplayCacheBytes = es.ReplayCacheHits, es.ReplayCacheEntries, es.ReplayCacheBytes
	return s
}
