package receipts

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/hot"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/seal"
	"github.com/receiptstore/receipts/observe"
)

// waitRecheck bounds how long a waiter sleeps before it re-reads the lease
// clock. Wake-ups come from the engine's Watch; this only matters for a
// holder that died (its lease runs out) and for injected clocks.
const waitRecheck = 250 * time.Millisecond

// DB is a receipts store. It is safe for concurrent use.
//
// The DB holds the contract (keys, receipts, leases, waiting, Do's outcome
// policy, counters) and calls its engine (package driver) for everything
// that touches storage: the Pebble engine for Open, another for OpenEngine.
type DB struct {
	// Set in Open, read-only after.
	opts    Options
	eng     driver.Engine
	tombs   driver.Tombstones // eng, when it keeps tombstones and they are on; nil otherwise
	seal    *seal.Sealer      // encrypts and decrypts results (Options.Keyring); never nil
	keys    *keys.Hasher      // the stored keys' hashes (Options.HashKeys); nil: keys as given
	secret  []byte            // eng.Secret(), for ProviderKey
	hashKey []byte            // derived from secret, for Event.KeyHash
	// observesDo: the Observer takes DoEvents (it is not a KindFilter
	// that declines them).
	observesDo bool
	beginner   observe.Beginner       // the Observer, if it is one (asserted once, not per call)
	tally      observe.ReplayObserver // the Observer, if it is one (doTallied)
	engName    string                 // eng.Name(), for events
	ttl        time.Duration          // Options.LeaseTTL

	// hot holds the atomics every call touches (the gate and the counters),
	// on one cache line of their own; an engine keeps its own.
	hot *hot.Line
	n   counters

	// drained is closed when the last call in flight exits after Close
	// began (hot.Gate).
	drained   chan struct{}
	drainOnce sync.Once
	closing   chan struct{} // closed when Close starts: waiters give up
	bgCancel  context.CancelFunc
	bg        sync.WaitGroup // background goroutines (GC loop)

	lastGC atomic.Pointer[GCStats]

	est durationEstimates // claim-to-outcome time of attempts, by operation class, for InProgressError.RetryAfter
}

// counters are the counters since Open that are not on the hot line.
type counters struct {
	takeovers, fails, releases, abandons atomic.Uint64
	waiters                              atomic.Int64  // claims waiting for another holder now
	expired                              atomic.Uint64 // claims answered ErrExpired
}

// Options returns the options in force: the defaults filled in, the epoch
// width as stored when the store was created. TombstoneWindow is negative
// when no tombstones are kept (turned off, or an engine that keeps none).
// Changing the result changes nothing.
func (db *DB) Options() Options { return db.opts }

// Driver returns the engine the store runs on, as the driver package sees
// it (database/sql's DB.Driver): for engine packages (pebblestore,
// receiptsprom's engine metrics) and tools, through a type assertion to an
// engine's or an optional interface's type. Calls made on it directly go
// around the contract: no lease, no fence, no counters.
func (db *DB) Driver() driver.Engine { return db.eng }

// Now returns the store's clock: the time its leases and retention are
// judged by (Options.Now for Pebble, or the database's clock for
// PostgreSQL), which decides Receipt.Abandoned. It returns ErrClosed after
// Close.
func (db *DB) Now(ctx context.Context) (time.Time, error) {
	if err := db.enter(); err != nil {
		return time.Time{}, err
	}
	defer db.exit()
	return db.now(ctx)
}

// now is the engine's clock.
func (db *DB) now(ctx context.Context) (time.Time, error) { return db.eng.Now(ctx) }

func (db *DB) beforeReplay(ctx context.Context, r *Receipt) error {
	if db.opts.BeforeReplay == nil {
		return nil
	}
	return db.opts.BeforeReplay(ctx, r)
}
