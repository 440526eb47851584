package receipts_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// TestTombstoneMigrationFromFormat2: a store written before tombstones
// (format 2: no window in its meta, no markers) is migrated by the first
// writable open: every record gets its marker, so its key is protected
// after its retention like a new one; a read-only open migrates nothing.
func TestTombstoneMigrationFromFormat2(t *testing.T) {
	s := newTestStore(t, nil) // Retention 1h, epochs of 15m
	db := s.db
	var ks []receipts.Key
	for i := range 50 {
		k := key("acct", fmt.Sprintf("k%d", i))
		retCommit(t, db, k, "x")
		ks = append(ks, k)
		s.clock.Advance(time.Minute)
	}
	abandoned := key("acct", "abandoned")
	l, _, err := db.Claim(bg, abandoned, retFP)
	require.NoError(t, err)
	require.NoError(t, l.Abandon(bg))
	// Make it a format-2 store, as the version before tombstones wrote it.
	m := storedMeta(t, db)
	old := *m
	old.Format, old.TombstoneWindow = 2, 0
	b, err := encoding.EncodeMeta(&old)
	require.NoError(t, err)
	require.NoError(t, db.Pebble().DeleteRange(keys.MarkersStart, keys.MarkersEnd, pebble.Sync))
	require.NoError(t, db.Pebble().Set(keys.Meta, b, pebble.Sync))
	require.NoError(t, db.Close())

	// Read-only: nothing written.
	ro := s.opts
	ro.Pebble = &pebble.Options{FS: s.fs, ReadOnly: true}
	rdb, err := receipts.Open(s.dir, &ro)
	require.NoError(t, err)
	require.Equal(t, 2, storedMeta(t, rdb).Format)
	require.Zero(t, countMarkers(t, rdb))
	require.NoError(t, rdb.Close())

	s.open()
	db = s.db
	m = storedMeta(t, db)
	require.Equal(t, encoding.StoreFormat, m.Format)
	require.Equal(t, int64(receipts.DefaultTombstoneWindow(time.Hour)), m.TombstoneWindow, "the default window recorded")
	require.Equal(t, 51, countMarkers(t, db), "a marker per record")
	// Past every receipt's retention, and past GC dropping their epochs:
	// each key is still marked used.
	s.clock.Advance(2 * time.Hour)
	st := retGC(t, db)
	require.Positive(t, st.EpochsDropped)
	for _, k := range append(ks, abandoned) {
		_, _, err := db.Claim(bg, k, []byte("other"))
		require.ErrorIs(t, err, receipts.ErrExpired, "%s after migration", k)
	}
}

func countMarkers(t *testing.T, db *receipts.DB) int {
	t.Helper()
	it, err := db.Pebble().NewIter(&pebble.IterOptions{LowerBound: keys.MarkersStart, UpperBound: keys.MarkersEnd})
	require.NoError(t, err)
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	require.NoError(t, it.Error())
	return n
}

// TestCrashTombstoneSurvivesPowerLoss: a tombstone is as durable as the
// receipt or claim it comes from. Receipts committed (and claims whose
// holder then dies) are acknowledged, GC drops the epochs of the expired
// records, and the power goes: the crash image (synced data only) still
// answers every key with ErrExpired, whatever the fingerprint, and frees
// it after the window. A claim released with no effect leaves none.
func TestCrashTombstoneSurvivesPowerLoss(t *testing.T) {
	fs := vfs.NewCrashableMem()
	clock := receiptstest.NewClock(receiptstest.DefaultStart)
	opts := receipts.Options{Retention: time.Hour, LeaseTTL: 30 * time.Second, GCInterval: -1, Now: clock.Now}
	open := func(fs vfs.FS) *receipts.DB {
		o := opts
		o.Pebble = &pebble.Options{FS: fs}
		db, err := receipts.Open("db", &o)
		require.NoError(t, err)
		return db
	}
	db := open(fs)
	var used []receipts.Key
	for i := range 20 {
		k := key("acct", fmt.Sprintf("done-%d", i))
		retCommit(t, db, k, "x")
		used = append(used, k)
		clock.Advance(5 * time.Minute)
	}
	crashed := key("acct", "crashed") // its holder dies right after the claim
	_, _, err := db.Claim(bg, crashed, retFP)
	require.NoError(t, err)
	used = append(used, crashed)
	released := key("acct", "released")
	l, _, err := db.Claim(bg, released, retFP)
	require.NoError(t, err)
	require.NoError(t, l.Release(bg))

	clock.Advance(2 * time.Hour) // every record expired
	st, err := db.GC(bg)
	require.NoError(t, err)
	require.Positive(t, st.EpochsDropped)
	window := db.Options().TombstoneWindow

	image := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	require.NoError(t, db.Close())
	db = open(image)
	defer db.Close()
	for _, k := range used {
		_, _, err := db.Claim(bg, k, []byte("any"))
		require.ErrorIs(t, err, receipts.ErrExpired, "%s after a power loss", k)
	}
	l, _, err = db.Claim(bg, released, []byte("any"))
	require.NoError(t, err, "a released claim leaves no tombstone")
	require.NoError(t, l.Release(bg))
	clock.Advance(window)
	for _, k := range used {
		l, _, err := db.Claim(bg, k, []byte("any"))
		require.NoError(t, err, "%s past the window", k)
		require.NoError(t, l.Release(bg))
	}
}

// TestTombstoneCorruptMarker: a marker that does not decode is reported as
// ErrCorrupt, never read as "no tombstone" (that would run the action
// again).
func TestTombstoneCorruptMarker(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	k := key("acct", "k")
	r := retCommit(t, db, k, "x")
	s.clock.Advance(2 * time.Hour)
	st := retGC(t, db) // the record's epoch is dropped: only the marker is left
	require.Positive(t, st.EpochsDropped)
	_, _, err := db.Claim(bg, k, retFP)
	require.ErrorIs(t, err, receipts.ErrExpired)
	mk := keys.AppendMarker(nil, uint64(r.UpdatedAt.UnixNano()/int64(retW)), k.Scope, k.ID)
	require.NoError(t, db.Pebble().Set(mk, []byte("garbage"), pebble.Sync))
	_, _, err = db.Claim(bg, k, retFP)
	require.ErrorIs(t, err, receipts.ErrCorrupt)
	_, err = db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrCorrupt)
}
