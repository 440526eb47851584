package receipts_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// GC: one range deletion for every dead epoch, whatever the number of
// receipts; a background loop that stops on Close; Stats.
//
// newTestStore: Retention 1h, LeaseTTL 30s, epoch width 15m, GCInterval -1.

// gcFillRaw adds n Succeeded receipts to s's store, exactly as the engine
// stores them (same key layout and record encoding), with last-write times
// spread evenly over [from, from+span): one sstable, ingested. It is how the
// tests and BenchmarkGC fill large stores fast (a million Claim+Commit
// pairs take minutes, and far longer under -race); the tests check through
// the public API that what it writes are receipts like any other. Keys are
// ("bulk", prefix+i).
func gcFillRaw(tb testing.TB, db *receipts.DB, fs vfs.FS, dir string, width time.Duration, prefix string, n int, from time.Time, span time.Duration) {
	tb.Helper()
	fp := encoding.EncodeUint64(42) // any non-empty bytes
	result := []byte(`{"status":"ok","id":"ch_3Nq8Xc2eZvKYlo2C0XjM"}`)
	type kv struct{ k, v []byte }
	recs := make([]kv, n) // no tombstone markers: GC writes them when it drops the records
	var arena []byte
	var id []byte
	for i := range n {
		at := from.Add(time.Duration(int64(span) * int64(i) / int64(n))).UnixNano()
		rec := encoding.Record{
			State:       encoding.StateSucceeded,
			Fingerprint: fp,
			Result:      result,
			Attempts:    1,
			Token:       1<<40 + uint64(i),
			CreatedAt:   at,
			UpdatedAt:   at,
		}
		if cap(arena)-len(arena) < 1024 {
			arena = make([]byte, 0, 1<<20)
		}
		id = strconv.AppendInt(append(id[:0], prefix...), int64(i), 10)
		start := len(arena)
		arena = keys.AppendRecord(arena, uint64(at/int64(width)), "bulk", string(id))
		mid := len(arena)
		arena = encoding.AppendRecord(arena, &rec)
		recs[i] = kv{arena[start:mid:mid], arena[mid:len(arena):len(arena)]}
	}
	slices.SortFunc(recs, func(a, b kv) int { return bytes.Compare(a.k, b.k) })

	name := fs.PathJoin(dir, fmt.Sprintf("fill-%d.sst", gcFillSeq.Add(1)))
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	require.NoError(tb, err)
	w := sstable.NewWriter(objstorageprovider.NewFileWritable(f), sstable.WriterOptions{
		TableFormat:  pebblestore.DB(db).FormatMajorVersion().MaxTableFormat(),
		FilterPolicy: bloom.FilterPolicy(10),
	})
	for _, r := range recs {
		require.NoError(tb, w.Set(r.k, r.v))
	}
	require.NoError(tb, w.Close())
	require.NoError(tb, pebblestore.DB(db).Ingest(context.Background(), []string{name}))
	// Pebble moved the file in (MemFS) or linked it (disk).
	if err := fs.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		tb.Fatal(err)
	}
}

var gcFillSeq atomic.Int64

// gcRecordCount counts the record keys Pebble still shows (expired ones
// GC has not dropped included).
func gcRecordCount(t *testing.T, db *receipts.DB) int {
	t.Helper()
	return len(retEpochs(t, db))
}

// TestGCWritesDoNotGrowWithReceipts drops 10k and then 100k expired
// receipts spread over 4 epochs, and checks GC's writes three ways: GCStats,
// the bytes Pebble logged to its WAL during GC (Pebble's own metric,
// independent of GCStats), and the record keys Pebble shows afterwards. The
// tombstone markers GC writes for the records it drops are read from those
// records and ingested as sstables, one per epoch, in one write: they grow
// with the records (their bytes are logged), the writes and the WAL do not.
func TestGCWritesDoNotGrowWithReceipts(t *testing.T) {
	type result struct {
		writes   int
		walBytes uint64
		dropped  int
		// The second GC, past the tombstone window, and the markers' size
		// on disk per key (compacted).
		tombWrites   int
		tombWALBytes uint64
		markerBytes  float64
		// The markers GC wrote for the records it dropped (one sstable per
		// epoch, ingested), their bytes and GC's time.
		markers       int
		gcMarkerBytes int64
		gcTime        time.Duration
	}
	run := func(t *testing.T, n int) result {
		s := newTestStore(t, nil)
		db := s.db
		t0 := s.clock.Now()
		gcFillRaw(t, db, s.fs, s.dir, retW, "r", n, t0, 4*retW) // epochs 0..3
		// A few through the public API too, in the same epochs.
		var api []receipts.Key
		for e := range 4 {
			s.clock.Advance(t0.Add(time.Duration(e)*retW + retW/2).Sub(s.clock.Now()))
			k := key("api", fmt.Sprint(e))
			retCommit(t, db, k, "x")
			api = append(api, k)
		}
		// The filled records are receipts like any other: at t0+4W-1ns
		// (Retention is 4W) every one is still visible.
		s.clock.Advance(t0.Add(4*retW - 1).Sub(s.clock.Now()))
		for _, id := range []string{"r0", fmt.Sprintf("r%d", n/2), fmt.Sprintf("r%d", n-1)} {
			r, err := db.Lookup(bg, key("bulk", id))
			require.NoError(t, err)
			require.Equal(t, receipts.Succeeded, r.State)
		}
		if n <= 10_000 { // a full scan: slow under -race
			require.Equal(t, int64(n+4), countOf(t, db).Succeeded)
		}
		// A survivor, in epoch 4.
		s.clock.Advance(retW/2 + 1)
		live := key("api", "live")
		retCommit(t, db, live, "x")
		require.NoError(t, pebblestore.DB(db).Flush())

		// Epochs 0..3 end by t0+4W, dead once Retention more has passed;
		// the survivor is visible until its write + Retention.
		s.clock.Advance(retR - 1)
		before := pebblestore.DB(db).Metrics()
		st := retGC(t, db)
		after := pebblestore.DB(db).Metrics()

		require.Equal(t, 4, st.EpochsDropped)
		require.Equal(t, 1, gcRecordCount(t, db), "only the live receipt is left")
		for _, k := range append(api, key("bulk", "r0"), key("bulk", fmt.Sprintf("r%d", n-1))) {
			_, err := db.Lookup(bg, k)
			require.ErrorIs(t, err, receipts.ErrNotFound)
		}
		retVisible(t, db, live, receipts.Succeeded)
		counts := countOf(t, db)
		require.Equal(t, 1, counts.LiveEpochs)
		require.Zero(t, counts.Expired)
		require.Equal(t, st, db.Stats().LastGC)
		require.Zero(t, st.TombstoneEpochsDropped, "tombstones outlive their receipts")
		res := result{writes: st.Writes, walBytes: after.WAL.BytesIn - before.WAL.BytesIn, dropped: st.EpochsDropped,
			markers: st.MarkersWritten, gcMarkerBytes: st.MarkerBytes, gcTime: st.Duration}
		require.Equal(t, n+4, st.MarkersWritten, "a marker for every record dropped")

		// Tombstones: every key is ErrExpired for the window, then GC
		// drops the 4 epochs of markers with one range deletion.
		require.NoError(t, pebblestore.DB(db).Compact(bg, keys.MarkersStart, keys.MarkersEnd, false))
		mb, err := pebblestore.DB(db).EstimateDiskUsage(keys.MarkersStart, keys.MarkersEnd)
		require.NoError(t, err)
		res.markerBytes = float64(mb) / float64(n+4)
		_, _, err = db.Claim(bg, key("bulk", fmt.Sprintf("r%d", n-1)), []byte("any"))
		require.ErrorIs(t, err, receipts.ErrExpired)
		s.clock.Advance(db.Options().TombstoneWindow)
		before = pebblestore.DB(db).Metrics()
		st = retGC(t, db)
		after = pebblestore.DB(db).Metrics()
		require.Equal(t, 4, st.TombstoneEpochsDropped)
		res.tombWrites, res.tombWALBytes = st.Writes, after.WAL.BytesIn-before.WAL.BytesIn
		for _, k := range []receipts.Key{key("bulk", "r0"), key("bulk", fmt.Sprintf("r%d", n-1)), api[0]} {
			l, _, err := db.Claim(bg, k, []byte("any"))
			require.NoError(t, err, "past the window, %s is free", k)
			require.NoError(t, l.Release(bg))
		}
		return res
	}
	small := run(t, 10_000)
	large := run(t, 100_000)
	t.Logf("10k receipts: %+v; 100k receipts: %+v", small, large)
	require.LessOrEqual(t, large.writes, 3, "the markers' sstables (one ingestion), one range deletion, the floor")
	require.Equal(t, small.writes, large.writes, "GC's writes grew with the number of receipts")
	require.Equal(t, small.walBytes, large.walBytes, "GC logged more bytes for more receipts")
	require.Less(t, large.walBytes, uint64(256), "GC logged %d bytes: more than a range deletion and a counter", large.walBytes)
	require.LessOrEqual(t, large.tombWrites, 4, "tombstones: a range deletion (+ the survivor's marker, the records' range deletion and the floor)")
	require.Equal(t, small.tombWrites, large.tombWrites, "GC's writes grew with the number of tombstones")
	require.Equal(t, small.tombWALBytes, large.tombWALBytes, "GC logged more bytes for more tombstones")
}

func TestGCWithNothingToDrop(t *testing.T) {
	s := newTestStore(t, nil)
	k := retCommit(t, s.db, key("acct", "a"), "x").Key
	st := retGC(t, s.db)
	require.Zero(t, st.EpochsDropped)
	require.Equal(t, 1, st.Writes, "the first GC persists the floor")
	require.Zero(t, st.BytesFreed)
	require.Equal(t, s.clock.Now(), st.At)
	st = retGC(t, s.db)
	require.Zero(t, st.Writes, "nothing to do, nothing written")
	s.clock.Advance(2 * retR)
	retGone(t, s.db, k)
	st = retGC(t, s.db)
	require.Equal(t, 1, st.EpochsDropped)
	require.Equal(t, 3, st.Writes, "the record's tombstone marker (an ingested sstable), the range deletion, the floor")
	require.Equal(t, 1, st.MarkersWritten)
	require.Positive(t, st.MarkerBytes)
	// Later, with nothing left to drop, only the floor moves (one write).
	s.clock.Advance(retW)
	st = retGC(t, s.db)
	require.Zero(t, st.EpochsDropped)
	require.Equal(t, 1, st.Writes)
	require.Zero(t, st.BytesFreed)
	// And again at the same time: nothing at all.
	st = retGC(t, s.db)
	require.Zero(t, st.Writes)
}

// TestGCBytesFreedCountsEachEpochOnce: the estimate covers the epochs this GC dropped, not
// again those earlier GCs dropped that Pebble has not reclaimed yet.
func TestGCBytesFreedCountsEachEpochOnce(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	t0 := s.clock.Now()
	for e := range 3 { // one sstable per epoch
		gcFillRaw(t, db, s.fs, s.dir, retW, fmt.Sprintf("e%d-", e), 5_000, t0.Add(time.Duration(e)*retW), retW)
		require.NoError(t, pebblestore.DB(db).Flush())
	}
	s.clock.Advance(retR + retW) // epoch 0 is dead
	first := retGC(t, db)
	require.Equal(t, 1, first.EpochsDropped)
	require.Positive(t, first.BytesFreed)
	s.clock.Advance(retW) // epoch 1 too
	second := retGC(t, db)
	require.Equal(t, 1, second.EpochsDropped)
	require.InDelta(t, float64(first.BytesFreed), float64(second.BytesFreed), float64(first.BytesFreed)/3,
		"the second GC counted the first one's epoch again: %d then %d bytes", first.BytesFreed, second.BytesFreed)
}

// TestGCCompactOnGC: the dropped range is compacted at once and its space
// returned before GC returns.
func TestGCCompactOnGC(t *testing.T) {
	for _, compact := range []bool{false, true} {
		t.Run(fmt.Sprintf("compact=%v", compact), func(t *testing.T) {
			s := newTestStore(t, func(o *pebblestore.Options) { o.CompactOnGC = compact })
			db := s.db
			t0 := s.clock.Now()
			gcFillRaw(t, db, s.fs, s.dir, retW, "r", 10_000, t0, 2*retW)
			require.NoError(t, pebblestore.DB(db).Flush())
			tables := func() uint64 { // the records' (their markers outlive them)
				n, err := pebblestore.DB(db).EstimateDiskUsage(keys.RecordsStart, keys.RecordsEnd)
				require.NoError(t, err)
				return n
			}
			before := tables()
			require.Positive(t, before)

			s.clock.Advance(2*retW + retR)
			st := retGC(t, db)
			require.Equal(t, 2, st.EpochsDropped)
			require.Equal(t, compact, st.Compacted)
			require.InDelta(t, float64(before), float64(st.BytesFreed), float64(before)/10)
			after := tables()
			t.Logf("sstables: %d bytes before, %d after GC (compact=%v), estimate freed %d", before, after, compact, st.BytesFreed)
			if compact {
				require.Less(t, after, before/10, "less than 90%% of the space returned")
			}
			// Either way, GC's own writes are the same: the markers' sstables
			// (one ingestion), the range deletion, the floor.
			require.Equal(t, 3, st.Writes)
			require.Equal(t, 10_000, st.MarkersWritten)
			require.Zero(t, gcRecordCount(t, db))
		})
	}
}

// gcLoopRunning reports whether a background GC goroutine exists: in its
// loop, or started by Open and not yet scheduled (Open starts no other
// goroutine).
func gcLoopRunning() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			s := string(buf[:n])
			return strings.Contains(s, "receipts.(*DB).gcLoop") || strings.Contains(s, "created by github.com/receiptstore/receipts.openDB")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestGCBackgroundLoop: with a short GCInterval the loop collects by
// itself; Close stops it and leaves no goroutine behind. The loop ticks on
// real time (the only test here that waits for it, a few milliseconds).
func TestGCBackgroundLoop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := newTestStore(t, func(o *pebblestore.Options) { o.GCInterval = time.Millisecond })
	db := s.db
	require.True(t, gcLoopRunning())
	k := retCommit(t, db, key("acct", "a"), "x").Key
	gcFillRaw(t, db, s.fs, s.dir, retW, "r", 1000, s.clock.Now(), retW)
	s.clock.Advance(retR + retW)
	retGone(t, db, k)
	require.Eventually(t, func() bool { return gcRecordCount(t, db) == 0 }, 10*time.Second, time.Millisecond,
		"the background GC did not drop the dead epoch")
	// the pass that dropped it records its stats once it is done
	require.Eventually(t, func() bool { return db.Stats().LastGC.At.Equal(s.clock.Now()) }, 10*time.Second, time.Millisecond,
		"LastGC.At %s, want %s", db.Stats().LastGC.At, s.clock.Now())

	require.NoError(t, db.Close())
	// Close waited for the loop's Done; the goroutine may still be returning
	// from it for a moment (seen under -race on a loaded machine).
	require.Eventually(t, func() bool { return !gcLoopRunning() }, 5*time.Second, time.Millisecond, "the GC loop outlived Close")
	_, err := db.GC(bg)
	require.ErrorIs(t, err, receipts.ErrClosed)
}

func TestGCIntervalDisablesOrDefaults(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		running  bool
	}{{-1, false}, {-time.Hour, false}, {0, true}, {time.Hour, true}} {
		t.Run(tc.interval.String(), func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			s := newTestStore(t, func(o *pebblestore.Options) { o.GCInterval = tc.interval })
			require.Equal(t, tc.running, gcLoopRunning())
			if !tc.running {
				// Nothing collects the expired receipt but an explicit GC.
				retCommit(t, s.db, key("acct", "a"), "x")
				s.clock.Advance(2 * retR)
				require.Equal(t, int64(1), countOf(t, s.db).Expired)
				require.Zero(t, s.db.Stats().LastGC.At)
				require.Equal(t, 1, retGC(t, s.db).EpochsDropped)
			}
			require.NoError(t, s.db.Close())
			require.False(t, gcLoopRunning())
		})
	}
}

func TestGCStatsReportsEpochsStatesAndLastGC(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	st := db.Stats()
	require.Equal(t, retR, st.Retention)
	require.Equal(t, retTTL, st.LeaseTTL)
	require.Equal(t, retW, st.EpochWidth)
	require.Zero(t, countOf(t, db).LiveEpochs)
	require.Zero(t, st.LastGC)

	// Epoch 0: a success, a failure, a claim whose holder crashed.
	s.clock.Advance(time.Minute)
	retCommit(t, db, key("a", "ok-0"), "x")
	lf, _, err := db.Claim(bg, key("a", "failed-0"), retFP)
	require.NoError(t, err)
	_, err = lf.Fail(bg, []byte("declined"))
	require.NoError(t, err)
	_, _, err = db.Claim(bg, key("a", "crashed-0"), retFP)
	require.NoError(t, err)
	// Epoch 1 (t0+20m): two successes; epoch 2 (t0+35m): a live claim.
	s.clock.Advance(19 * time.Minute)
	retCommit(t, db, key("b", "ok-1a"), "x")
	retCommit(t, db, key("b", "ok-1b"), "x")
	s.clock.Advance(15 * time.Minute)
	_, _, err = db.Claim(bg, key("c", "live-2"), retFP)
	require.NoError(t, err)

	c := countOf(t, db)
	require.Equal(t, 3, c.LiveEpochs)
	require.Equal(t, int64(2), c.Pending)
	require.Equal(t, int64(1), c.Abandoned)
	require.Equal(t, int64(3), c.Succeeded)
	require.Equal(t, int64(1), c.Failed)
	require.Zero(t, c.Expired)
	st = db.Stats()
	require.Positive(t, st.DiskBytes)
	require.Zero(t, st.LastGC)

	// t0+61m: epoch 0's records have expired, the claim's lease has run
	// out; GC can drop epoch 0 once it ended Retention ago (t0+75m).
	s.clock.Advance(26 * time.Minute)
	c = countOf(t, db)
	require.Equal(t, 3, c.LiveEpochs)
	require.Equal(t, int64(3), c.Expired)
	require.Equal(t, int64(1), c.Pending)
	require.Equal(t, int64(1), c.Abandoned)
	require.Equal(t, int64(2), c.Succeeded)
	require.Zero(t, c.Failed)
	require.Zero(t, retGC(t, db).EpochsDropped, "epoch 0 is not dead yet")
	require.Equal(t, 3, countOf(t, db).LiveEpochs)

	s.clock.Advance(retW) // t0+76m
	require.NoError(t, pebblestore.DB(db).Flush())
	gst := retGC(t, db)
	require.Equal(t, 1, gst.EpochsDropped)
	require.Equal(t, 3, gst.Writes, "the markers, the range deletion, the floor")
	require.Positive(t, gst.BytesFreed)
	require.Equal(t, s.clock.Now(), gst.At)
	require.False(t, gst.Compacted)
	require.Equal(t, gst, db.Stats().LastGC)
	c = countOf(t, db)
	require.Equal(t, 2, c.LiveEpochs)
	require.Zero(t, c.Expired)
	require.Equal(t, int64(1), c.Pending)
	require.Equal(t, int64(2), c.Succeeded)

	// Counts survive a reopen; LastGC is since Open.
	s.reopen()
	c = countOf(t, s.db)
	require.Equal(t, 2, c.LiveEpochs)
	require.Equal(t, int64(2), c.Succeeded)
	require.Zero(t, s.db.Stats().LastGC)
}

// TestGCConcurrentWithClaims runs GC in a loop while claims and commits go
// on and every operation moves the clock 20s ahead (133 minutes in all, so
// epochs die under the workers' feet): a receipt is visible until its
// expiry and gone after, whenever GC ran; a commit fails only if its claim
// had expired (-race).
func TestGCConcurrentWithClaims(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	const workers, perWorker = 4, 100
	var (
		mu      sync.Mutex
		done    []*receipts.Receipt
		stop    = make(chan struct{})
		gcDone  = make(chan struct{})
		dropped int
	)
	go func() {
		defer close(gcDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := db.GC(bg)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			dropped += st.EpochsDropped
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				k := key(fmt.Sprint("w", w), fmt.Sprint(i))
				claimedBy := s.clock.Now()
				l, _, err := db.Claim(bg, k, retFP)
				if err != nil {
					t.Error(err)
					return
				}
				s.clock.Advance(20 * time.Second)
				r, err := l.Commit(bg, []byte("x"))
				if errors.Is(err, receipts.ErrLeaseLost) && !s.clock.Now().Before(claimedBy.Add(retR)) {
					continue // the claim expired before the commit: right
				}
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := db.Lookup(bg, k); err != nil && s.clock.Now().Before(r.ExpiresAt) {
					t.Errorf("%s: %v before its expiry %s", k, err, r.ExpiresAt)
				}
				mu.Lock()
				done = append(done, r)
				mu.Unlock()
				if i%25 == 24 {
					st, err := db.GC(bg)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					dropped += st.EpochsDropped
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-gcDone
	require.Positive(t, dropped)
	last := done[0].ExpiresAt
	for _, r := range done {
		if r.ExpiresAt.After(last) {
			last = r.ExpiresAt
		}
	}
	for {
		now := s.clock.Now()
		for _, r := range done {
			_, err := db.Lookup(bg, r.Key)
			if now.Before(r.ExpiresAt) {
				require.NoError(t, err, "%s at %s, expires %s", r.Key, now, r.ExpiresAt)
			} else {
				require.ErrorIs(t, err, receipts.ErrNotFound)
			}
		}
		if now.After(last.Add(retW)) {
			break
		}
		s.clock.Advance(10 * time.Minute)
		retGC(t, db)
	}
	retGC(t, db)
	require.Zero(t, gcRecordCount(t, db))
}

// TestGCSSTablesSplitAtEpochs: no sstable holds records of two epochs (nor
// records and the store's other keys), so GC's range deletion covers whole
// sstables and Pebble's delete-only compactions return their space after a
// flush, without CompactOnGC. Filled through the public API, without a
// flush between epochs: one memtable holds them all.
func TestGCSSTablesSplitAtEpochs(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	t0 := s.clock.Now()
	for e := range 4 {
		s.clock.Advance(t0.Add(time.Duration(e)*retW + time.Minute).Sub(s.clock.Now()))
		for i := range 300 {
			retCommit(t, db, key("acct", fmt.Sprintf("e%d-%d", e, i)), strings.Repeat("result ", 20))
		}
	}
	s.clock.Advance(retW) // epoch 4
	live := retCommit(t, db, key("acct", "live"), "x").Key
	require.NoError(t, pebblestore.DB(db).Flush())

	levels, err := pebblestore.DB(db).SSTables()
	require.NoError(t, err)
	tables := 0
	for _, level := range levels {
		for _, tb := range level {
			lo, hi := tb.Smallest.UserKey, tb.Largest.UserKey
			if bytes.Compare(hi, keys.RecordsStart) < 0 || bytes.Compare(lo, keys.RecordsEnd) >= 0 {
				continue // the store's other keys
			}
			tables++
			require.True(t, bytes.Compare(lo, keys.RecordsStart) >= 0 && bytes.Compare(hi, keys.RecordsEnd) < 0,
				"sstable %s holds records and other keys: %q..%q", tb.FileNum, lo, hi)
			elo, _ := keys.Epoch(lo)
			ehi, _ := keys.Epoch(hi)
			require.Equal(t, elo, ehi, "sstable %s spans epochs %d..%d", tb.FileNum, elo, ehi)
		}
	}
	require.GreaterOrEqual(t, tables, 5)
	require.Zero(t, countMarkers(t, db), "no marker is written with a record")

	// The records' sstables (markers outlive them by the tombstone window).
	sst := func() uint64 {
		n, err := pebblestore.DB(db).EstimateDiskUsage(keys.RecordsStart, keys.RecordsEnd)
		require.NoError(t, err)
		return n
	}
	before := sst()
	s.clock.Advance(retR - 30*time.Second) // epochs 0..3 dead, live still visible
	st := retGC(t, db)
	require.Equal(t, 4, st.EpochsDropped)
	require.False(t, st.Compacted)
	require.NoError(t, pebblestore.DB(db).Flush()) // the range deletion reaches an sstable
	require.Eventually(t, func() bool { return sst() < before/10 }, 10*time.Second, 5*time.Millisecond,
		"Pebble's delete-only compactions returned less than 90%%: %d of %d bytes left", sst(), before)
	retVisible(t, db, live, receipts.Succeeded)
	require.Equal(t, 1, gcRecordCount(t, db))

	// The markers GC wrote for the dropped records: one sstable per epoch,
	// holding markers only, so that GC's later range deletion of an epoch
	// of markers covers whole sstables too.
	require.Equal(t, 1200, st.MarkersWritten)
	require.Equal(t, 1200, countMarkers(t, db))
	levels, err = pebblestore.DB(db).SSTables()
	require.NoError(t, err)
	markerTables := 0
	for _, level := range levels {
		for _, tb := range level {
			lo, hi := tb.Smallest.UserKey, tb.Largest.UserKey
			if bytes.Compare(hi, keys.MarkersStart) < 0 || bytes.Compare(lo, keys.MarkersEnd) >= 0 {
				continue
			}
			markerTables++
			require.True(t, bytes.Compare(lo, keys.MarkersStart) >= 0 && bytes.Compare(hi, keys.MarkersEnd) < 0,
				"sstable %s holds markers and other keys: %q..%q", tb.FileNum, lo, hi)
			elo, _ := keys.MarkerEpoch(lo)
			ehi, _ := keys.MarkerEpoch(hi)
			require.Equal(t, elo, ehi, "sstable %s spans marker epochs %d..%d", tb.FileNum, elo, ehi)
		}
	}
	require.Equal(t, 4, markerTables)
}
