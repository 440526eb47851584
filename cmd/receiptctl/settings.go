package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pebbleengine"
	"github.com/receiptstore/receipts/pebblestore"
)

// retentionFlags are the settings flags of the offline commands.
//
// A store records the Retention and LeaseTTL its service runs with, and
// receiptctl uses them: ls and get show what the service shows, and gc drops
// only what the service would. --retention only checks: a store that records
// another retention is refused. --override-retention is the one way to use
// another retention, and it says so on stderr each time.
type retentionFlags struct {
	retention time.Duration    // --retention: what the caller expects; 0 = not given
	override  time.Duration    // --override-retention: use this instead; 0 = not given
	keyring   receipts.Keyring // --keyring (privacy.go): opens encrypted results; nil = none
}

// retentionSource says where the retention in force came from.
type retentionSource int

const (
	fromStore    retentionSource = iota // recorded in the store
	fromOverride                        // --override-retention
	fromFlag                            // --retention, the store records none (an older version wrote it)
	fromDefault                         // the default, the store records none
)

func (s retentionSource) String() string {
	switch s {
	case fromStore:
		return "recorded in the store"
	case fromOverride:
		return "--override-retention, NOT the store's"
	case fromFlag:
		return "--retention; the store records none"
	}
	return "default; the store records none"
}

func (f retentionFlags) check() error {
	if f.retention != 0 && f.retention < time.Millisecond {
		return usagef("--retention %s: want at least 1ms", f.retention)
	}
	if f.override != 0 && f.override < time.Millisecond {
		return usagef("--override-retention %s: want at least 1ms", f.override)
	}
	return nil
}

// recordedSettings returns the Retention and LeaseTTL that db's meta
// records; zero for a store of the previous format, which records none.
func recordedSettings(db *receipts.DB) (retention, leaseTTL time.Duration, err error) {
	retention, leaseTTL, err = pebbleengine.RecordedSettings(pebblestore.DB(db))
	if err != nil {
		return 0, 0, fmt.Errorf("read the store's meta: %w", err)
	}
	return retention, leaseTTL, nil
}

// resolve decides the retention (and lease TTL) to open the store with,
// given what it records (zero: nothing). A zero result means "the recorded
// value". needKnown refuses a retention that is only the default (gc).
func (f retentionFlags) resolve(recRetention, recTTL time.Duration, needKnown bool, stderr io.Writer) (retention, ttl time.Duration, src retentionSource, err error) {
	switch {
	case f.override != 0:
		if recRetention != 0 && f.override == recRetention {
			return 0, 0, fromStore, nil
		}
		fmt.Fprintf(stderr, "receiptctl: WARNING: using retention %s (--override-retention) instead of the store's recorded %s: records older than %s are treated as expired%s\n",
			f.override, showRecorded(recRetention), f.override, map[bool]string{true: ", and gc drops them for good", false: ""}[needKnown])
		ttl = min(receipts.DefaultLeaseTTL, f.override/2)
		if recTTL != 0 && recTTL < f.override {
			ttl = recTTL
		}
		return f.override, ttl, fromOverride, nil
	case recRetention != 0:
		if f.retention != 0 && f.retention != recRetention {
			return 0, 0, 0, fmt.Errorf("the store records retention %s, not %s (--retention): to use %s anyway, give --override-retention %s", recRetention, f.retention, f.retention, f.retention)
		}
		return 0, 0, fromStore, nil
	case f.retention != 0:
		return f.retention, min(receipts.DefaultLeaseTTL, f.retention/2), fromFlag, nil
	case needKnown:
		return 0, 0, 0, usageError{errors.New("the store records no retention (an older version wrote it): give the service's Options.Retention with --retention (for example --retention 24h)")}
	}
	return receipts.DefaultRetention, receipts.DefaultLeaseTTL, fromDefault, nil
}

func showRecorded(d time.Duration) string {
	if d == 0 {
		return "(none)"
	}
	return d.String()
}

// openResolved opens dir with the settings f resolves to against what the
// store records (see retentionFlags). It first opens the store read-only, to
// read what it records (and to report a directory that holds no receipts
// store rather than write a meta record into it).
func openResolved(dir string, f retentionFlags, readOnly, compact, needKnown bool, stderr io.Writer) (*receipts.DB, retentionSource, error) {
	if err := f.check(); err != nil {
		return nil, 0, err
	}
	probe, err := openStoreOpts(dir, 0, 0, true, false, f.keyring, stderr)
	if err != nil {
		return nil, 0, err
	}
	recRetention, recTTL, err := recordedSettings(probe)
	if err == nil {
		var retention, ttl time.Duration
		var src retentionSource
		retention, ttl, src, err = f.resolve(recRetention, recTTL, needKnown, stderr)
		if err == nil {
			o := probe.Options()
			if readOnly && (retention == 0 || (retention == o.Retention && ttl == o.LeaseTTL)) {
				return probe, src, nil
			}
			if err = probe.Close(); err != nil {
				return nil, 0, err
			}
			db, err := openStoreOpts(dir, retention, ttl, readOnly, compact, f.keyring, stderr)
			return db, src, err
		}
	}
	_ = probe.Close()
	return nil, 0, err
}

// openStoreOpts opens the store in dir for receiptctl: no background GC,
// warnings to stderr, CompactOnGC as given, the retention and lease TTL as
// given (zero: the store's recorded ones).
func openStoreOpts(dir string, retention, ttl time.Duration, readOnly, compact bool, kr receipts.Keyring, stderr io.Writer) (*receipts.DB, error) {
	if err := checkStoreDir(dir); err != nil {
		return nil, err
	}
	opts := &pebblestore.Options{
		Options: receipts.Options{
			Retention:  retention,
			LeaseTTL:   ttl,
			GCInterval: -1,
			Logger:     newLogger(stderr),
			Keyring:    kr,
		},
		CompactOnGC: compact,
		Pebble:      &pebble.Options{ReadOnly: readOnly},
	}
	db, err := pebblestore.Open(dir, opts)
	switch {
	case errors.Is(err, receipts.ErrLocked):
		return nil, &lockedError{dir: dir, err: err}
	case err != nil && readOnly && !errors.Is(err, receipts.ErrCorrupt) && !errors.Is(err, receipts.ErrUnknownFormat):
		return nil, fmt.Errorf("cannot open a store at %s (is it a receipts store?): %w", dir, err)
	case err != nil:
		return nil, err
	}
	return db, nil
}
