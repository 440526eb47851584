package receipts_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// TestTombstoneMigrationFromFormat2: a store written before tombstones
// (format 2: no window in its meta, no markers) is opened as the current
// format by the first writable open, without writing a marker (none is
// kept beside a live record): GC writes every record's marker when it
// drops its epoch, so its key is protected after its retention like a new
// one; a read-only open writes nothing.
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
	require.NoError(t, pebblestore.DB(db).DeleteRange(keys.MarkersStart, keys.MarkersEnd, pebble.Sync))
	require.NoError(t, pebblestore.DB(db).Set(keys.Meta, b, pebble.Sync))
	require.NoError(t, db.Close())

	// Read-only: nothing written.
	ro := s.opts
	ro.Pebble = &pebble.Options{FS: s.fs, ReadOnly: true}
	rdb, err := pebblestore.Open(s.dir, &ro)
	require.NoError(t, err)
	require.Equal(t, 2, storedMeta(t, rdb).Format)
	require.Zero(t, countMarkers(t, rdb))
	require.NoError(t, rdb.Close())

	s.open()
	db = s.db
	m = storedMeta(t, db)
	require.Equal(t, encoding.StoreFormat, m.Format)
	require.Equal(t, int64(receipts.DefaultTombstoneWindow(time.Hour)), m.TombstoneWindow, "the default window recorded")
	require.Zero(t, countMarkers(t, db), "no marker written before GC")
	// Past every receipt's retention, and past GC dropping their epochs:
	// each key is still marked used.
	s.clock.Advance(2 * time.Hour)
	st := retGC(t, db)
	require.Positive(t, st.EpochsDropped)
	require.Equal(t, 51, st.MarkersWritten, "a marker per record dropped")
	require.Equal(t, 51, countMarkers(t, db))
	for _, k := range append(ks, abandoned) {
		_, _, err := db.Claim(bg, k, []byte("other"))
		require.ErrorIs(t, err, receipts.ErrExpired, "%s after migration", k)
	}
}

func countMarkers(t *testing.T, db *receipts.DB) int {
	t.Helper()
	it, err := pebblestore.DB(db).NewIter(&pebble.IterOptions{LowerBound: keys.MarkersStart, UpperBound: keys.MarkersEnd})
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
		db, err := pebblestore.Open("db", &pebblestore.Options{Options: o, Pebble: &pebble.Options{FS: fs}})
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
	require.NoError(t, pebblestore.DB(db).Set(mk, []byte("garbage"), pebble.Sync))
	_, _, err = db.Claim(bg, k, retFP)
	require.ErrorIs(t, err, receipts.ErrCorrupt)
	_, err = db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrCorrupt)
}

// TestCrashDuringGCKeepsTombstones: GC writes the tombstone markers of the
// records it drops (one sstable per epoch, ingested) before the synced batch
// that drops them, so a crash at any point of GC leaves every dropped key
// its record or its marker. The power goes before each filesystem write GC
// makes (and Pebble's work it sets off), and after the last: every crash
// image (the synced data alone, and with half the unsynced data too) is
// reopened, and every used key is still refused inside the window,
// whatever the fingerprint; a claim released with no effect is free. Under
// the nogcmarkers mutation (GC drops the records without their markers)
// the images after the drop refuse nothing.
func TestCrashDuringGCKeepsTombstones(t *testing.T) {
	mem := vfs.NewCrashableMem()
	var mu sync.Mutex
	var images []*vfs.MemFS
	var during atomic.Bool
	rng := rand.New(rand.NewPCG(1, 2))
	snap := func() {
		mu.Lock()
		defer mu.Unlock()
		images = append(images, mem.CrashClone(vfs.CrashCloneCfg{}),
			mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}))
	}
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if during.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			snap()
		}
		return nil
	}))
	clock := receiptstest.NewClock(receiptstest.DefaultStart)
	opts := receipts.Options{Retention: time.Hour, LeaseTTL: 30 * time.Second, GCInterval: -1, Now: clock.Now}
	open := func(fs vfs.FS) *receipts.DB {
		o := opts
		db, err := pebblestore.Open("db", &pebblestore.Options{Options: o, Pebble: &pebble.Options{FS: fs}})
		require.NoError(t, err)
		return db
	}
	db := open(fs)
	var used []receipts.Key
	for i := range 40 { // over 4 epochs of 15m
		k := key("acct", fmt.Sprintf("done-%d", i))
		retCommit(t, db, k, "x")
		used = append(used, k)
		clock.Advance(90 * time.Second)
	}
	crashed := key("acct", "crashed") // its holder dies right after the claim
	_, _, err := db.Claim(bg, crashed, retFP)
	require.NoError(t, err)
	used = append(used, crashed)
	released := key("acct", "released")
	l, _, err := db.Claim(bg, released, retFP)
	require.NoError(t, err)
	require.NoError(t, l.Release(bg))

	clock.Advance(2 * time.Hour) // every record expired, every epoch dead
	during.Store(true)
	st, err := db.GC(bg)
	during.Store(false)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.EpochsDropped, 4)
	snap() // after GC
	require.NoError(t, db.Close())

	dropped := 0 // images whose records are gone: only the markers answer
	for i, image := range images {
		db := open(image)
		if countRecords(t, db) == 0 {
			dropped++
		}
		names, err := image.List("db")
		require.NoError(t, err)
		for _, name := range names {
			require.False(t, strings.HasPrefix(name, "receipts-gc-markers-"), "%s left behind after a crash at GC's write %d", name, i/2)
		}
		for _, k := range used {
			_, _, err := db.Claim(bg, k, []byte("any"))
			require.ErrorIs(t, err, receipts.ErrExpired, "%s after a crash at GC's write %d of %d", k, i/2, len(images)/2)
		}
		l, _, err := db.Claim(bg, released, []byte("any"))
		require.NoError(t, err, "a released claim leaves no tombstone (image %d)", i)
		require.NoError(t, l.Release(bg))
		require.NoError(t, db.Close())
	}
	t.Logf("%d crash images, %d of them after the records were dropped", len(images), dropped)
	require.Positive(t, dropped, "no crash image after the records were dropped")
	require.Less(t, dropped, len(images), "no crash image before the records were dropped")
	require.Greater(t, len(images)-dropped, 10, "too few crash images before the drop: the markers' writes were not crashed in")
}

func countRecords(t *testing.T, db *receipts.DB) int {
	t.Helper()
	it, err := pebblestore.DB(db).NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	require.NoError(t, err)
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	require.NoError(t, it.Error())
	return n
}

// TestTombstoneFormat3Markers: a store of format 3 keeps a marker beside
// every live record, written with it; the current format writes none, but
// opened on such a store it deletes them with their records, and GC writes
// them again before it drops their epoch. So a Forget leaves no tombstone
// behind, a record moved to a newer epoch answers with its newest time, and
// each tombstone is listed once.
func TestTombstoneFormat3Markers(t *testing.T) {
	s := newTestStore(t, nil) // Retention 1h, epochs of 15m
	db := s.db
	k1, k2, k3, k4 := key("acct", "forgotten"), key("acct", "k2"), key("acct", "k3"), key("acct", "moved")
	retCommit(t, db, k2, "x")
	retCommit(t, db, k3, "x")
	for _, k := range []receipts.Key{k1, k4} { // claims whose holders die
		_, _, err := db.Claim(bg, k, retFP)
		require.NoError(t, err)
	}
	// What format 3 wrote beside each record: its marker, same epoch, same time.
	pdb := pebblestore.DB(db)
	it, err := pdb.NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	require.NoError(t, err)
	for ok := it.First(); ok; ok = it.Next() {
		rec, err := encoding.DecodeRecord(it.Value())
		require.NoError(t, err)
		require.NoError(t, pdb.Set(keys.MarkerOf(bytes.Clone(it.Key())), encoding.EncodeUint64(uint64(rec.UpdatedAt)), pebble.Sync))
	}
	require.NoError(t, it.Close())
	m := *storedMeta(t, db)
	m.Format = 3
	b, err := encoding.EncodeMeta(&m)
	require.NoError(t, err)
	require.NoError(t, pdb.Set(keys.Meta, b, pebble.Sync))
	require.NoError(t, db.Close())
	s.open()
	db = s.db
	require.Equal(t, encoding.StoreFormat, storedMeta(t, db).Format)
	require.Equal(t, 4, countMarkers(t, db))

	s.clock.Advance(20 * time.Minute) // the next epoch; both leases ran out
	l1, _, err := db.Claim(bg, k1, retFP)
	require.NoError(t, err)
	require.NoError(t, l1.Forget(bg)) // the record goes, and its marker
	l4, _, err := db.Claim(bg, k4, retFP)
	require.NoError(t, err) // taken over, moved to this epoch: its old marker goes with its old key
	r4, err := l4.Commit(bg, []byte("x"))
	require.NoError(t, err)
	require.Equal(t, 2, countMarkers(t, db), "k2's and k3's")

	s.clock.Advance(2 * time.Hour)
	st := retGC(t, db)
	require.Equal(t, 2, st.EpochsDropped)
	require.Equal(t, 3, st.MarkersWritten)
	require.Equal(t, 3, countMarkers(t, db))
	for _, k := range []receipts.Key{k2, k3, k4} {
		_, _, err := db.Claim(bg, k, []byte("any"))
		require.ErrorIs(t, err, receipts.ErrExpired, "%s", k)
	}
	var listed []receipts.Key
	for tb, err := range db.Tombstones(bg, "acct", 0) {
		require.NoError(t, err)
		listed = append(listed, tb.Key)
		if tb.Key == k4 {
			require.Equal(t, r4.UpdatedAt, tb.UsedAt, "the moved record's newest write")
		}
	}
	require.ElementsMatch(t, []receipts.Key{k2, k3, k4}, listed)
	l, _, err := db.Claim(bg, k1, []byte("any"))
	require.NoError(t, err, "a forgotten key leaves no tombstone")
	require.NoError(t, l.Release(bg))
}
