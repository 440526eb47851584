// Package pebbleengine is the Pebble engine behind receipts.Open: a
// driver.Engine over one Pebble directory.
//
// Records live under keys.AppendRecord (an epoch of their last write, then
// the key); a lookup probes the live epochs newest-first. A per-key lock
// (internal/locktable) serializes read-check-write of one key and is held
// across the sync, so same-key callers never see undurable state; the pure
// rules are internal/machine's. Finished, synced records are remembered in
// the replay cache (internal/rcache), so a retry of one is answered from
// memory (a small record's bytes: see fromCache for why that is safe) or
// with a single engine read checked against it. The last Pending record
// written for a key (a claim, a renewal, a takeover) is remembered too, so
// that the key's next write, most often the claim's commit, decides without
// reading it back (memo.go). GC drops whole epochs with one range deletion.
//
// Besides driver.Engine it serves what only Pebble can: the *pebble.DB for
// the application's own data, checkpoints, and receipts committed in the
// same batch as an effect (Lease.CommitWith, DB.DoBatch).
package pebbleengine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/hot"
	"github.com/receiptstore/receipts/internal/locktable"
	"github.com/receiptstore/receipts/internal/rcache"
)

// ErrLocked is returned by Open when another process (or another DB in this
// process) holds the directory: driver.ErrLocked (receipts.ErrLocked).
var ErrLocked = driver.ErrLocked

// Config is the engine's configuration: the shared settings (validated by
// the root) and Pebble's own.
type Config struct {
	driver.Config
	// Pebble tunes the engine; it is cloned, never changed (nil: defaults).
	Pebble *pebble.Options
	// CompactOnGC makes GC compact the dropped range at once.
	CompactOnGC bool
	// ReplayCacheSize is the replay cache's memory in bytes (<= 0: none).
	ReplayCacheSize int64
	// Hot is the cache line the engine's clock and cache-hit counter live
	// on, shared with the root's gate and counters (nil: one of its own).
	Hot *hot.Line
}

// Engine is a receipts store in one Pebble directory. It is safe for
// concurrent use.
type Engine struct {
	// Set in Open, read-only after.
	cfg       driver.Config // Now never nil; EpochWidth as stored
	pdb       *pebble.DB
	dirLock   *pebble.Lock
	locks     *locktable.Table
	cache     *rcache.Cache // recently finished receipts; nil if disabled
	memo      *pendingMemo  // the Pending records last written, for the next write (memo.go)
	width     int64         // epoch width, ns
	retention int64         // ns
	window    int64         // TombstoneWindow, ns; <= 0: no tombstones
	secret    []byte
	loc       *time.Location // of Config.Now's times: records report times in it
	readOnly  bool           // Pebble.ReadOnly: inspection only
	// liveMarkers: the store held tombstone markers at or above the GC floor
	// when it was opened (format 3 wrote one beside every record), which
	// writes move and delete with their records (tombstone.go).
	liveMarkers bool
	compactOnGC bool
	tokenFn     func() (uint64, error) // e.newToken, bound once (a method value allocates)
	dir         string                 // the store's directory, on po.FS
	po          *pebble.Options        // the options Pebble runs with (GC's marker sstables are written with them)

	// hot.Clock is the store's time high-water mark, on a line of its own.
	hot *hot.Line
	// cacheHits counts replay-cache answers, striped: one counter on the
	// clock's line cost hot keys 5-7% at 64 callers (BenchmarkHotKeys).
	cacheHits hot.Counter
	clockMu   sync.Mutex    // serializes writes of keys.Clock, so the last one written is the largest
	minEpoch  atomic.Uint64 // no record lives in an older epoch
	floor     atomic.Uint64 // epochs below were dropped by GC; writes never land there
	// rawDB: DB has handed out the Pebble database, whose user may write
	// the store's keys behind its back; replays are no longer answered
	// from the cache's bytes alone (fromCache), and writes read Pebble,
	// not the memo (readMemo).
	rawDB atomic.Bool
	// markerMin: no tombstone marker lives in an older epoch.
	markerMin atomic.Uint64

	tok struct {
		sync.Mutex        // protects next and ceil; held across the ceiling's sync (once per tokenBlock)
		next, ceil uint64 // next token to hand out; first token not yet reserved on disk
	}

	gcMu sync.Mutex // one GC at a time

	// closeMu guards closed: the calls an engine package makes outside the
	// root's in-flight gate (Checkpoint, Metrics) hold it for reading, and
	// Close sets closed under it before it closes Pebble.
	closeMu sync.RWMutex
	closed  bool

	// erased holds the erasures in force (privacy.go); eraseMu serializes EraseScope and
	// MarkKeyDestroyed; keysMu serializes the writes of data keys.
	erased  atomic.Pointer[erasedSet]
	eraseMu sync.Mutex
	keysMu  sync.Mutex
}

var _ driver.Engine = (*Engine)(nil)

// Name returns "pebble".
func (e *Engine) Name() string { return "pebble" }

// Config returns the settings in force (the epoch width as stored).
func (e *Engine) Config() driver.Config { return e.cfg }

// Secret returns the store's random secret, created with it.
func (e *Engine) Secret() []byte { return e.secret }

// DB returns the Pebble database the store runs on, for the application's
// own data (receipts.DB.Pebble). From then on replays are checked against
// the engine's bytes, never answered from the replay cache's alone, and
// writes read the record from Pebble (not from the memo of the last
// write): what the caller writes with it does not go through the engine's
// writes, which keep the cache and the memo right.
func (e *Engine) DB() *pebble.DB {
	e.rawDB.Store(true)
	return e.pdb
}

// Peek is DB without turning the memory answers off, for the module's own
// harnesses and benchmarks (internal/peek), which only read, flush or
// compact with it.
func (e *Engine) Peek() *pebble.DB { return e.pdb }

// NewBatch returns a batch of the store's Pebble database (DoBatch's).
func (e *Engine) NewBatch() *pebble.Batch { return e.pdb.NewBatch() }

// Checkpoint writes a consistent copy of the store to dir, which must not
// exist.
func (e *Engine) Checkpoint(dir string) error {
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		return driver.ErrClosed
	}
	if err := e.pdb.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("receipts: checkpoint to %s: %w", dir, err)
	}
	return nil
}

// Metrics reports Pebble's health figures (driver.MetricsReporter).
func (e *Engine) Metrics() []driver.Metric {
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		return nil
	}
	m := e.pdb.Metrics()
	return []driver.Metric{
		{Name: "pebble_compaction_debt_bytes", Help: "Pebble's estimate of the bytes compactions must rewrite to reach a healthy LSM shape.", Value: float64(m.Compact.EstimatedDebt)},
		{Name: "pebble_compactions_in_progress", Help: "Compactions running now.", Value: float64(m.Compact.NumInProgress)},
		{Name: "pebble_read_amplification", Help: "Sublevels and levels a read may visit (L0 sublevels plus non-empty levels).", Value: float64(m.ReadAmp())},
		{Name: "pebble_wal_bytes", Help: "Live data in the write-ahead log files.", Value: float64(m.WAL.Size)},
		{Name: "pebble_wal_files", Help: "Live write-ahead log files.", Value: float64(m.WAL.Files)},
		{Name: "pebble_disk_bytes", Help: "Disk space the engine uses (the application's own keys in the same engine included).", Value: float64(m.DiskSpaceUsage())},
		{Name: "pebble_memtable_bytes", Help: "Bytes allocated to memtables.", Value: float64(m.MemTable.Size)},
		{Name: "pebble_compactions_total", Help: "Compactions since open.", Value: float64(m.Compact.Count), Counter: true},
	}
}
