package pebbleengine

import (
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/hot"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/locktable"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/internal/rcache"
)

// Open opens the store in dir, creating it if needed. cfg's shared settings
// are already defaulted and validated. It fails with driver.ErrUnknownFormat
// for a store of a newer format, ErrLocked if another process holds dir,
// and driver.ErrCorrupt if the store's meta data is damaged.
func Open(dir string, cfg Config) (*Engine, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	po := pebbleOptions(cfg.Pebble, cfg.Logger)
	if err := po.FS.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("receipts: create %s: %w", dir, err)
	}
	lock, err := pebble.LockDirectory(dir, po.FS)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLocked, dir, err)
	}
	po.Lock = lock
	opened := false
	defer func() {
		if !opened { // an error, or a panic out of Pebble (a failed directory fsync)
			_ = lock.Close()
		}
	}()
	pdb, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("receipts: open %s: %w", dir, err)
	}
	e := &Engine{
		cfg:         cfg.Config,
		pdb:         pdb,
		dirLock:     lock,
		locks:       locktable.New(),
		cache:       rcache.New(cfg.ReplayCacheSize),
		memo:        newPendingMemo(),
		retention:   int64(cfg.Retention),
		readOnly:    po.ReadOnly,
		compactOnGC: cfg.CompactOnGC,
		hot:         cfg.Hot,
		dir:         dir,
		po:          po,
	}
	if e.hot == nil {
		e.hot = new(hot.Line)
	}
	e.tokenFn = e.newToken
	if !e.readOnly {
		e.removeMarkerFiles()
	}
	if err := e.load(); err != nil {
		_ = pdb.Close()
		return nil, err
	}
	e.cfg.EpochWidth = time.Duration(e.width)
	opened = true
	return e, nil
}

// load reads or creates the meta record and restores the token counter, the
// GC floor, the oldest epoch and the clock's high-water mark.
func (e *Engine) load() error {
	t := e.cfg.Now()
	e.loc = t.Location()
	now := machine.ClockNanos(t)
	if err := e.loadMeta(now); err != nil {
		return err
	}
	ceil, err := e.getCounter(keys.TokenCeiling)
	if err != nil {
		return err
	}
	e.tok.next, e.tok.ceil = max(ceil, 1), max(ceil, 1)
	floor, err := e.getCounter(keys.GCFloor)
	if err != nil {
		return err
	}
	e.floor.Store(floor)

	// The clock never runs behind what the store has seen: the newest epoch
	// holding a record, and the start of the GC floor (GC ran at least the
	// Retention of the time after it). Not floor*width+Retention: reopened
	// with a longer Retention than GC ran with, that is in the future, and
	// the store's time would stand still until then (leases would not run
	// out, abandoned claims could not be taken over).
	hwm := now
	if floor > 0 {
		hwm = max(hwm, int64(floor)*e.width)
	}
	clock, err := e.getCounter(keys.Clock)
	if err != nil {
		return err
	}
	hwm = max(hwm, int64(clock))
	first, last, found, err := e.epochBounds()
	if err != nil {
		return err
	}
	minEpoch := uint64(max(hwm, 0) / e.width)
	if found {
		minEpoch = min(minEpoch, first)
		hwm = max(hwm, int64(last)*e.width)
	}
	e.minEpoch.Store(max(minEpoch, floor))
	markerMin := uint64(max(hwm, 0) / e.width)
	if first, found, err := e.firstMarkerEpoch(); err != nil {
		return err
	} else if found {
		markerMin = min(markerMin, first)
	}
	e.markerMin.Store(min(markerMin, e.minEpoch.Load()))
	if e.liveMarkers, err = e.markersFrom(floor); err != nil {
		return err
	}
	e.hot.Clock.Store(hwm)
	return e.loadErasures(hwm)
}

// loadMeta reads the meta record, creating it for a new store: the epoch
// width, the ProviderKey secret, and the Retention, LeaseTTL and
// TombstoneWindow in force (the recorded ones for the options left zero),
// checked by Config.Check. A store of an earlier format needs nothing
// written but its meta (encoding.StoreFormat: GC writes the markers of the
// epochs it drops).
// The meta is rewritten, synced, when the settings in force differ from
// what it records, or when it is of the previous format (which records
// neither); not on a read-only store.
func (e *Engine) loadMeta(now int64) error {
	meta, err := e.getMeta()
	write, create := false, false
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		meta = &encoding.Meta{EpochWidth: int64(e.cfg.EpochWidth), Secret: make([]byte, 32), CreatedAt: now}
		_, _ = rand.Read(meta.Secret)
		write, create = true, true
	case err != nil:
		return err
	case meta.Format < encoding.MinStoreFormat || meta.Format > encoding.StoreFormat:
		return fmt.Errorf("%w: store format %d, this version reads formats %d to %d", driver.ErrUnknownFormat, meta.Format, encoding.MinStoreFormat, encoding.StoreFormat)
	}
	if meta.Retention > 0 && e.cfg.StoredRetention {
		e.cfg.Retention = time.Duration(meta.Retention)
	}
	if meta.LeaseTTL > 0 && e.cfg.StoredLeaseTTL {
		e.cfg.LeaseTTL = time.Duration(meta.LeaseTTL)
	}
	if e.cfg.TombstoneWindow == 0 || e.cfg.StoredTombstoneWindow {
		if meta.TombstoneWindow != 0 {
			e.cfg.TombstoneWindow = time.Duration(meta.TombstoneWindow)
		} else {
			e.cfg.TombstoneWindow = driver.DefaultTombstoneWindow(e.cfg.Retention)
		}
	}
	if e.cfg.TombstoneWindow < 0 {
		e.cfg.TombstoneWindow = -1
	}
	e.cfg.EpochWidth = time.Duration(meta.EpochWidth)
	if e.cfg.Check != nil {
		if err := e.cfg.Check(e.cfg); err != nil { // nothing written yet
			return fmt.Errorf("%w (in force: Retention %s, LeaseTTL %s, TombstoneWindow %s, stored epoch width %s; recorded: Retention %s, LeaseTTL %s, TombstoneWindow %s)",
				err, e.cfg.Retention, e.cfg.LeaseTTL, e.cfg.TombstoneWindow, e.cfg.EpochWidth,
				time.Duration(meta.Retention), time.Duration(meta.LeaseTTL), time.Duration(meta.TombstoneWindow))
		}
	}
	e.width, e.secret = meta.EpochWidth, meta.Secret
	e.retention = int64(e.cfg.Retention)
	e.window = int64(e.cfg.TombstoneWindow)
	ttl := int64(e.cfg.LeaseTTL)
	if meta.Format != encoding.StoreFormat || meta.Retention != e.retention || meta.LeaseTTL != ttl || meta.TombstoneWindow != e.window {
		write = true
	}
	if !write || (e.readOnly && !create) { // a read-only open of no store fails to write
		return nil
	}
	next := *meta
	next.Format, next.Retention, next.LeaseTTL, next.TombstoneWindow = encoding.StoreFormat, e.retention, ttl, e.window
	b, err := encoding.EncodeMeta(&next)
	if err != nil {
		return err
	}
	if err := e.pdb.Set(keys.Meta, b, pebble.Sync); err != nil {
		return fmt.Errorf("receipts: write meta: %w", err)
	}
	return nil
}

// epochBounds returns the oldest and newest epochs holding records.
func (e *Engine) epochBounds() (first, last uint64, found bool, err error) {
	it, err := e.pdb.NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	if err != nil {
		return 0, 0, false, fmt.Errorf("receipts: open iterator: %w", err)
	}
	defer it.Close()
	if it.First() {
		var ok bool
		if first, ok = keys.Epoch(it.Key()); !ok {
			return 0, 0, false, fmt.Errorf("%w: malformed record key %q", driver.ErrCorrupt, it.Key())
		}
		found = true
	}
	if it.Last() {
		var ok bool
		if last, ok = keys.Epoch(it.Key()); !ok {
			return 0, 0, false, fmt.Errorf("%w: malformed record key %q", driver.ErrCorrupt, it.Key())
		}
	}
	if err := it.Error(); err != nil {
		return 0, 0, false, fmt.Errorf("receipts: scan epochs: %w", err)
	}
	return first, last, found, nil
}

// RecordedSettings returns the Retention and LeaseTTL that the store in
// pdb records; zero for a store of the previous format, which records none.
// It is for offline tools (receiptctl), which must not read the key layout
// themselves.
func RecordedSettings(pdb *pebble.DB) (retention, leaseTTL time.Duration, err error) {
	m, err := (&Engine{pdb: pdb}).getMeta()
	if err != nil {
		return 0, 0, err
	}
	return time.Duration(m.Retention), time.Duration(m.LeaseTTL), nil
}

func (e *Engine) getMeta() (*encoding.Meta, error) {
	v, closer, err := e.pdb.Get(keys.Meta)
	if err != nil {
		if errors.Is(err, pebble.ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("receipts: read meta: %w", err)
	}
	defer closer.Close()
	m, err := encoding.DecodeMeta(v)
	if err != nil {
		return nil, fmt.Errorf("%w: meta: %w", driver.ErrCorrupt, err)
	}
	return m, nil
}

func (e *Engine) getCounter(key []byte) (uint64, error) {
	v, closer, err := e.pdb.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("receipts: read %q: %w", key, err)
	}
	defer closer.Close()
	n, err := encoding.DecodeUint64(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: %w", driver.ErrCorrupt, key, err)
	}
	return n, nil
}

// Close persists the clock and closes Pebble and the directory lock. The
// root calls it once, after every call in flight has ended.
func (e *Engine) Close() (err error) {
	e.closeMu.Lock()
	e.closed = true
	e.closeMu.Unlock()
	defer func() {
		// Runs even if the clock write below panics (a WAL sync failure
		// under a logger whose Fatalf panics): the engine and the directory
		// lock are released either way.
		if cerr := e.pdb.Close(); err == nil {
			err = cerr
		}
		if lerr := e.dirLock.Close(); err == nil {
			err = lerr
		}
		if err != nil {
			err = fmt.Errorf("receipts: close: %w", err)
		}
	}()
	// Persist the clock so that a restart with the clock behind resumes
	// from here (records stay exactly as expired as they were).
	if !e.readOnly {
		err = e.pdb.Set(keys.Clock, encoding.EncodeUint64(uint64(e.hot.Clock.Load())), pebble.Sync)
	}
	return err
}

// DefaultReplayCacheSize is the replay cache's memory when the options
// leave it zero (receipts.Open; pebblestore.Options.ReplayCacheSize).
const DefaultReplayCacheSize = 8 << 20

// Opener returns receipts.OpenEngine's open function for the store in dir,
// with c's Pebble settings and the shared ones OpenEngine hands it: the one
// way receipts.Open and pebblestore.Open reach the engine.
func Opener(dir string, c Config) func(driver.Config) (driver.Engine, error) {
	return func(cfg driver.Config) (driver.Engine, error) {
		c.Config = cfg
		e, err := Open(dir, c)
		if err != nil {
			return nil, err // not a nil *Engine in a non-nil interface
		}
		return e, nil
	}
}
