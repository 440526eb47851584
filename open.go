package receipts

import (
	"context"
	"fmt"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/hot"
	"github.com/receiptstore/receipts/observe"
)

// OpenEngine returns a DB on a storage engine, for engine packages
// (pebblestore.Open and pgstore.Open call it and return the same *DB, as
// database/sql's OpenDB takes a driver.Connector): it copies, defaults and
// validates opts (nil means defaults), then calls open with the settings
// every engine shares, and serves the contract on the engine open returns.
// Options.Now left nil means the engine's own clock (the database's, for
// PostgreSQL). If open fails, its error is returned as is.
func OpenEngine(open func(cfg driver.Config) (driver.Engine, error), opts *Options) (*DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	stored := storedSettings{retention: o.Retention == 0, leaseTTL: o.LeaseTTL == 0, tombstoneWindow: o.TombstoneWindow == 0}
	now := o.Now
	o.ensureDefaults()
	o.Now = now // nil: the engine's clock
	if err := o.validate(); err != nil {
		return nil, err
	}
	return openDB(o, stored, open)
}

// storedSettings says which options were left zero at Open: those take
// the store's recorded values.
type storedSettings struct{ retention, leaseTTL, tombstoneWindow bool }

// openDB opens the engine with o's shared settings and starts background GC.
// REQUIRES: o defaulted and validated.
func openDB(o Options, stored storedSettings, openEngine func(driver.Config) (driver.Engine, error)) (*DB, error) {
	h := new(hot.Line)
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
	o.HashKeys = keyForm != nil // as the store records it (DB.Options)
	db := &DB{
		seal:       seal,
		keys:       keyForm,
		opts:       o,
		eng:        eng,
		tombs:      tombs,
		secret:     eng.Secret(),
		hashKey:    deriveHashKey(eng.Secret()),
		observesDo: observe.Observes(o.Observer, observe.DoEvent),
		engName:    eng.Name(),
		ttl:        o.LeaseTTL,
		hot:        h,
		closing:    closing,
		drained:    make(chan struct{}),
	}
	db.beginner, _ = o.Observer.(observe.Beginner)
	db.tally, _ = o.Observer.(observe.ReplayObserver)
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
