//go:build !receipts_nopebble

package receipts

import (
	"time"

	"github.com/receiptstore/receipts/internal/pebbleengine"
)

// Open opens the store in dir on the Pebble engine, creating it if needed.
// Open copies opts; nil means defaults. It fails with ErrInvalidOptions for
// options that cannot work, ErrUnknownFormat for a store of a newer format,
// ErrLocked if another process holds dir, and ErrCorrupt if the store's meta
// data is damaged.
//
// The store records the Retention, LeaseTTL and TombstoneWindow it runs
// with (Retention and LeaseTTL are described here; TombstoneWindow is
// recorded the same way), so that
// offline tools (receiptctl) see what the service sees. A zero Retention or
// LeaseTTL means the store's recorded value (DefaultRetention and
// DefaultLeaseTTL for a new store, or one written by a version that
// recorded none); a non-zero one that differs is used and recorded (synced)
// in its place, unless the store is opened read-only (pebblestore.Options'
// Pebble.ReadOnly), which uses it without recording it. DB.Options reports the values in force.
// With a zero Retention, a LeaseTTL of DefaultRetention or more is refused:
// set Retention too.
//
// Open is the embedded default: the Pebble engine with its default tuning
// and a replay cache of 8 MiB. Package pebblestore opens the same store
// with Pebble's own options (an in-memory FS for tests, the block cache),
// and holds the Pebble engine's own forms: the Pebble database for the
// application's data, checkpoints, DoBatch, RunBatch, CommitWith and Effect.
// A program built with the receipts_nopebble tag links no Pebble, and its
// Open returns ErrUnsupported (docs/postgresql.md).
func Open(dir string, opts *Options) (*DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return OpenEngine(pebbleengine.Opener(dir, pebbleengine.Config{ReplayCacheSize: pebbleengine.DefaultReplayCacheSize}), &o)
}
