package receipts

import (
	"context"
	"fmt"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/hot"
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
// in its place, unless the store is opened read-only (Options.Pebble.ReadOnly),
// which uses it without recording it. DB.Options reports the values in force.
// With a zero Retention, a LeaseTTL of DefaultRetention or more is refused:
// set Retention too.
func Open(dir string, opts *Options) (*DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	stored := storedSettings{retention: o.Retention == 0, leaseTTL: o.LeaseTTL == 0, tombstoneWindow: o.TombstoneWindow == 0}
	o.ensureDefaults()
	if o.ReplayCacheSize == 0 {
		o.ReplayCacheSize = DefaultReplayCacheSize
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	h := new(hot.Line)
	return openDB(o, stored, h, func(cfg driver.Config) (driver.Engine, error) {
		return pebbleengine.Open(dir, pebbleengine.Config{
			Config:          cfg,
			Pebble:          o.Pebble,
			CompactOnGC:     o.CompactOnGC,
			ReplayCacheSize: o.ReplayCacheSize,
			Hot:             h,
		})
	})
}

// OpenEngine returns a DB on another storage engine, for engine packages
// (pgstore.Open calls it and returns the same *DB): it copies, defaults and
// validates opts (nil means defaults), then calls open with the settings
// every engine shares, and serves the contract on the engine open returns.
// Options.Now left nil means the engine's own clock (the database's, for
// PostgreSQL). The Pebble-only fields (Pebble, CompactOnGC,
// ReplayCacheSize) must be zero: ErrInvalidOptions otherwise. If open
// fails, its error is returned as is. On the DB it returns, Pebble returns
// nil, and CommitWith, DoBatch and Checkpoint return ErrUnsupported.
func OpenEngine(open func(cfg driver.Config) (driver.Engine, error), opts *Options) (*DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.Pebble != nil:
		return nil, fmt.Errorf("%w: Options.Pebble is for the Pebble engine only", ErrInvalidOptions)
	case o.CompactOnGC:
		return nil, fmt.Errorf("%w: Options.CompactOnGC is for the Pebble engine only", ErrInvalidOptions)
	case o.ReplayCacheSize != 0:
		return nil, fmt.Errorf("%w: Options.ReplayCacheSize is for the Pebble engine only", ErrInvalidOptions)
	}
	stored := storedSettings{retention: o.Retention == 0, leaseTTL: o.LeaseTTL == 0, tombstoneWindow: o.TombstoneWindow == 0}
	now := o.Now
	o.ensureDefaults()
	o.Now = now // nil: the engine's clock
	if err := o.validate(); err != nil {
		return nil, err
	}
	return openDB(o, stored, new(hot.Line), open)
}

// storedSettings says which options were left zero at Open: those take
// the store's recorded values.
type storedSettings struct{ retention, leaseTTL, tombstoneWindow bool }

// openDB opens the engine with o's shared settings and starts background GC.
// REQUIRES: o defaulted and validated.
func openDB(o Options, stored storedSettings, h *hot.Line, openEngine func(driver.Config) (driver.Engine, error)) (*DB, error) {
	closing := make(chan struct{})
	closed := func() bool { return h.Gate.Load()&gateClosed != 0 }
	eng, err := openEngine(driver.Config{
		Retention:             o.Retention,
		LeaseTTL:              o.LeaseTTL,
		StoredRetention:       stored.retention,
		StoredLeaseTTL:        stored.leaseTTL,
		TombstoneWindow:       o.TombstoneWindow,
		StoredTombstoneWindow: stored.tombstoneWindow,
		EpochWidth:            o.EpochWidth,
		Now:                   o.Now,
		Logger:                o.Logger,
		Check: func(c driver.Config) error {
			in := o
			in.Retention, in.LeaseTTL, in.EpochWidth, in.TombstoneWindow = c.Retention, c.LeaseTTL, c.EpochWidth, c.TombstoneWindow
			return in.validate()
		},
		Closing: closed,
	})
	if err != nil {
		return nil, err
	}
	inForce := eng.Config()
	o.Retention, o.LeaseTTL, o.EpochWidth = inForce.Retention, inForce.LeaseTTL, inForce.EpochWidth
	tombs, _ := eng.(driver.Tombstones)
	switch {
	case tombs == nil && o.TombstoneWindow > 0:
		_ = eng.Close()
		return nil, fmt.Errorf("%w: TombstoneWindow %s: the %s engine keeps no tombstones", ErrUnsupported, o.TombstoneWindow, eng.Name())
	case tombs == nil || inForce.TombstoneWindow < 0:
		o.TombstoneWindow = -1
		tombs = nil
	default:
		o.TombstoneWindow = inForce.TombstoneWindow
	}
	seal, err := newSealer(o.Keyring, eng)
	if err != nil {
		_ = eng.Close()
		return nil, err
	}
	keyForm, err := openKeyForm(context.Background(), eng, o.HashKeys, o.Keyring)
	if err != nil {
		_ = eng.Close()
		return nil, err
	}
	db := &DB{
		seal:       seal,
		keys:       keyForm,
		opts:       o,
		eng:        eng,
		tombs:      tombs,
		secret:     eng.Secret(),
		hashKey:    deriveHashKey(eng.Secret()),
		observesDo: observes(o.Observer, DoEvent),
		engName:    eng.Name(),
		ttl:        o.LeaseTTL,
		hot:        h,
		closing:    closing,
		drained:    make(chan struct{}),
	}
	db.peb, _ = eng.(*pebbleengine.Engine)
	db.beginner, _ = o.Observer.(Beginner)
	db.lastGC.Store(&GCStats{})
	ctx, cancel := context.WithCancel(context.Background())
	db.bgCancel = cancel
	if interval := db.gcInterval(); interval > 0 {
		db.bg.Add(1)
		go db.gcLoop(ctx, interval)
	}
	return db, nil
}

// Close waits for in-flight calls to finish (their commits land or fail
// cleanly), stops background work and closes the engine. Once it has begun
// no new lease is handed out: callers waiting for another holder's receipt,
// or for the key, get ErrClosed. Afterwards every method returns ErrClosed.
// A second Close returns nil.
func (db *DB) Close() error {
	old := db.hot.Gate.Or(gateClosed)
	if old&gateClosed != 0 {
		return nil
	}
	close(db.closing)
	if old != 0 {
		<-db.drained
	}
	db.bgCancel()
	db.bg.Wait()
	return db.eng.Close()
}

// gateClosed is the bit of hot.Line.Gate that Close sets.
const gateClosed = 1 << 62

// enter registers an in-flight call; exit ends it. One atomic add each.
func (db *DB) enter() error {
	if db.hot.Gate.Add(1)&gateClosed != 0 {
		db.exit()
		return ErrClosed
	}
	return nil
}

func (db *DB) exit() {
	if db.hot.Gate.Add(-1) == gateClosed { // Close has begun and nothing is in flight
		db.drainOnce.Do(func() { close(db.drained) })
	}
}
