package receipts

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/hot"
	"github.com/receiptstore/receipts/internal/pebbleengine"
	"github.com/receiptstore/receipts/internal/peek"
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
	peb     *pebbleengine.Engine // eng, when it is the Pebble engine; nil otherwise
	tombs   driver.Tombstones    // eng, when it keeps tombstones and they are on; nil otherwise
	seal    *sealer              // encrypts and decrypts results (Options.Keyring); never nil
	keys    *keyHasher           // the stored keys' hashes (Options.HashKeys); nil: keys as given
	secret  []byte               // eng.Secret(), for ProviderKey
	hashKey []byte               // derived from secret, for Event.KeyHash
	// observesDo: the Observer takes DoEvents (it is not a KindFilter
	// that declines them).
	observesDo bool
	beginner   Beginner      // the Observer, if it is one (asserted once, not per call)
	engName    string        // eng.Name(), for events
	ttl        time.Duration // Options.LeaseTTL

	// hot holds the atomics every call touches (the gate, the counters, the
	// Pebble engine's clock), on one cache line of their own.
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

// Pebble returns the engine the store runs on, for the application's own
// data. The store's keys all start with the reserved prefix "\x00rcpt"; keep
// the application's keys out of it. Do not close it: Close does. On another
// engine than Pebble (OpenEngine) it returns nil. Once it has been called,
// replays are checked against the engine rather than answered from the
// replay cache's memory (Options.ReplayCacheSize): the store cannot see
// what is written with it.
func (db *DB) Pebble() *pebble.DB {
	if db.peb == nil {
		return nil
	}
	return db.peb.DB()
}

func init() {
	peek.Pebble = func(x any) *pebble.DB {
		if db := x.(*DB); db.peb != nil {
			return db.peb.Peek()
		}
		return nil
	}
}

// Checkpoint writes a consistent copy of the store (and of the application's
// data in the same engine) to dir, which must not exist. Open the copy to
// inspect a running service's receipts offline. On another engine than
// Pebble it returns ErrUnsupported.
func (db *DB) Checkpoint(dir string) error {
	if err := db.enter(); err != nil {
		return err
	}
	defer db.exit()
	if db.peb == nil {
		return fmt.Errorf("%w: Checkpoint on the %s engine", ErrUnsupported, db.eng.Name())
	}
	return db.peb.Checkpoint(dir)
}

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
