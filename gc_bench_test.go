package receipts_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
)

// BenchmarkGC fills a store on disk with N receipts spread over 4 epochs
// (plus N/100 that stay live), lets them expire with the fake clock, and
// runs one GC, without and with CompactOnGC. N is RECEIPTS_GC_BENCH_N
// (default 20000, what CI runs); the README figures use 1000000:
//
//	RECEIPTS_GC_BENCH_N=1000000 go test -run '^$' -bench GC -benchtime=1x -timeout 1h .
//
// The store is filled through the public API (Claim+Commit from 256
// goroutines, every commit synced) unless RECEIPTS_GC_BENCH_FILL=ingest,
// which ingests sstables of records in the engine's exact format (much
// faster; the same bytes on disk, without the claims' overwritten versions).
//
// ns/op includes the fill: read the metrics.
//
//	gc-ms                   DB.GC's wall time (GCStats.Duration); with
//	                        CompactOnGC it includes the compaction
//	gc-writes               GCStats.Writes
//	gc-wal-bytes            bytes Pebble logged during GC (its WAL.BytesIn)
//	bytes-before            directory size (sum of file sizes), flushed, before GC
//	bytes-after-gc          right after GC returned
//	bytes-after-compaction  once Pebble's compactions settled: for compact=false
//	                        after a flush of the range deletion, which lets
//	                        Pebble's delete-only compactions drop whole sstables
//	percent-reclaimed       100 * (before - after-compaction) / (before - baseline),
//	                        baseline being the store without the expired
//	                        receipts (measured on a second store holding only
//	                        the live ones)
//	sst-bytes-*             the same, from Pebble's metrics (live sstables)
func BenchmarkGC(b *testing.B) {
	n := 20_000
	if v := os.Getenv("RECEIPTS_GC_BENCH_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 100 {
			b.Fatalf("RECEIPTS_GC_BENCH_N=%q: want a number >= 100", v)
		}
	}
	fill := os.Getenv("RECEIPTS_GC_BENCH_FILL")
	if fill == "" {
		fill = "api"
	}
	for _, compact := range []bool{false, true} {
		b.Run(fmt.Sprintf("n=%d/fill=%s/compact=%v", n, fill, compact), func(b *testing.B) {
			for range b.N {
				benchGCOnce(b, n, fill, compact)
			}
		})
	}
}

type gcBenchStore struct {
	dir   string
	clock *receiptstest.Clock
	db    *receipts.DB
}

func openGCBench(b *testing.B, compact bool) *gcBenchStore {
	s := &gcBenchStore{dir: filepath.Join(b.TempDir(), "db"), clock: receiptstest.NewClock(receiptstest.DefaultStart)}
	opts := &pebblestore.Options{
		Options: receipts.Options{
			Retention:  time.Hour,
			LeaseTTL:   30 * time.Second,
			GCInterval: -1,
			Now:        s.clock.Now,
		},
		CompactOnGC: compact,
	}
	db, err := pebblestore.Open(s.dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	s.db = db
	return s
}

// fillAPI claims and commits n keys ("bulk", prefix+i) at the current time
// from many goroutines.
func (s *gcBenchStore) fillAPI(b *testing.B, prefix string, n int) {
	const workers = 256
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	fp := []byte("fingerprint-of-the-approved-intent")
	result := []byte(`{"status":"ok","id":"ch_3Nq8Xc2eZvKYlo2C0XjM"}`)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				l, _, err := s.db.Claim(bg, key("bulk", prefix+strconv.Itoa(i)), fp)
				if err == nil {
					_, err = l.Commit(bg, result)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// fill adds n receipts spread evenly over [now, now+span), advancing the
// clock, and leaves the clock at now+span.
func (s *gcBenchStore) fill(b *testing.B, how, prefix string, n int, span time.Duration) {
	const phases = 8
	start := s.clock.Now()
	switch how {
	case "api":
		for p := range phases {
			s.fillAPI(b, fmt.Sprintf("%s%d-", prefix, p), n*(p+1)/phases-n*p/phases)
			s.clock.Advance(span / phases)
		}
	case "ingest":
		// The sstable is written next to the store, not in it.
		gcFillRaw(b, s.db, vfs.Default, filepath.Dir(s.dir), s.db.Stats().EpochWidth, prefix, n, start, span)
		s.clock.Advance(span)
	default:
		b.Fatalf("RECEIPTS_GC_BENCH_FILL=%q: want api or ingest", how)
	}
}

// settle flushes the memtable and waits (up to a minute) until Pebble has
// no compaction running and the directory size has stopped changing.
func (s *gcBenchStore) settle(b *testing.B) gcBenchSize {
	if err := pebblestore.DB(s.db).Flush(); err != nil {
		b.Fatal(err)
	}
	last, stable := s.size(b), 0
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && stable < 10; {
		time.Sleep(50 * time.Millisecond) // a benchmark waiting for Pebble's background work
		cur := s.size(b)
		if cur == last && pebblestore.DB(s.db).Metrics().Compact.NumInProgress == 0 {
			stable++
		} else {
			stable = 0
		}
		last = cur
	}
	return last
}

// gcBenchSize is the store's size three ways.
type gcBenchSize struct {
	dir      uint64 // every file in the directory (WAL, MANIFEST, OPTIONS included)
	dirSST   uint64 // the directory's sstables
	wal      uint64 // the directory's WAL files (recycled ones included)
	manifest uint64 // the directory's MANIFEST files
	sst      uint64 // Pebble's metrics: live sstables
}

func (s *gcBenchStore) size(b *testing.B) gcBenchSize {
	var z gcBenchSize
	z.dir, z.dirSST, z.wal, z.manifest = dirBytes(b, s.dir)
	z.sst = pebblestore.DB(s.db).Metrics().Table.Local.LiveSize
	return z
}

// dirBytes sums the sizes of the files under dir: all of them, the
// sstables (*.sst), the WAL (*.log, recycled ones included) and the
// MANIFEST files.
func dirBytes(b *testing.B, dir string) (total, sst, wal, manifest uint64) {
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed by Pebble while we walk
			}
			return err
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				total += uint64(info.Size())
				switch name := d.Name(); {
				case strings.HasSuffix(name, ".sst"):
					sst += uint64(info.Size())
				case strings.HasSuffix(name, ".log"):
					wal += uint64(info.Size())
				case strings.HasPrefix(name, "MANIFEST"):
					manifest += uint64(info.Size())
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return total, sst, wal, manifest
}

func benchGCOnce(b *testing.B, n int, how string, compact bool) {
	const (
		retention = time.Hour
		width     = retention / 4
	)
	live := max(n/100, 1)

	// Baseline: a store holding only the live receipts.
	base := openGCBench(b, compact)
	base.clock.Advance(4*width + width/2)
	base.fill(b, how, "live-", live, width/4)
	baseline := base.settle(b)
	if err := base.db.Close(); err != nil {
		b.Fatal(err)
	}

	s := openGCBench(b, compact)
	defer s.db.Close()
	t0 := s.clock.Now()
	fillStart := time.Now()
	s.fill(b, how, "old-", n, 4*width) // epochs 0..3
	s.clock.Advance(width / 2)
	s.fill(b, how, "live-", live, width/4) // epoch 4
	fillTime := time.Since(fillStart)
	before := s.settle(b)
	if st := countOf(b, s.db); st.Succeeded+st.Expired != int64(n+live) || st.LiveEpochs != 5 {
		b.Fatalf("filled %d receipts in %d epochs, want %d in 5", st.Succeeded+st.Expired, st.LiveEpochs, n+live)
	}

	// Epochs 0..3 ended at 4W; dead from 4W+Retention. The live receipts
	// (written in [4.5W, 4.75W)) stay visible.
	s.clock.Advance(4*width + retention + time.Minute - s.clock.Now().Sub(t0))
	m0 := pebblestore.DB(s.db).Metrics()
	st, err := s.db.GC(bg)
	if err != nil {
		b.Fatal(err)
	}
	m1 := pebblestore.DB(s.db).Metrics()
	afterGC := s.size(b)
	if st.EpochsDropped != 4 || st.Compacted != compact {
		b.Fatalf("GC: %+v", st)
	}
	afterCompaction := s.settle(b)
	if got := countOf(b, s.db); got.Succeeded != int64(live) || got.Expired != 0 {
		b.Fatalf("after GC: %d visible, %d expired; want %d and 0", got.Succeeded, got.Expired, live)
	}

	pct := func(before, after, baseline uint64) float64 {
		if before <= baseline {
			return 0
		}
		return 100 * (float64(before) - float64(after)) / float64(before-baseline)
	}
	walBytes := m1.WAL.BytesIn - m0.WAL.BytesIn
	b.ReportMetric(float64(st.Duration.Microseconds())/1000, "gc-ms")
	b.ReportMetric(float64(st.Writes), "gc-writes")
	b.ReportMetric(float64(walBytes), "gc-wal-bytes")
	b.ReportMetric(float64(before.dir), "bytes-before")
	b.ReportMetric(float64(afterGC.dir), "bytes-after-gc")
	b.ReportMetric(float64(afterCompaction.dir), "bytes-after-compaction")
	b.ReportMetric(pct(before.dirSST, afterCompaction.dirSST, baseline.dirSST), "percent-reclaimed")
	b.ReportMetric(pct(before.dir, afterCompaction.dir, baseline.dir), "percent-reclaimed-dir")
	b.ReportMetric(float64(before.sst), "sst-bytes-before")
	b.ReportMetric(float64(afterGC.sst), "sst-bytes-after-gc")
	b.ReportMetric(float64(afterCompaction.sst), "sst-bytes-after-compaction")
	b.Logf("n=%d live=%d fill=%s compact=%v: filled in %s; GC %s (%d writes, %d WAL bytes, est. freed %d)\n"+
		"  baseline (live receipts only): %+v\n  before:            %+v\n  after GC:          %+v\n  after compaction:  %+v\n"+
		"  reclaimed: %.1f%% of the expired receipts' sstable bytes (directory walk), %.1f%% by Pebble's metrics, %.1f%% of the whole directory",
		n, live, how, compact, fillTime.Round(time.Millisecond), st.Duration, st.Writes, walBytes, st.BytesFreed,
		baseline, before, afterGC, afterCompaction,
		pct(before.dirSST, afterCompaction.dirSST, baseline.dirSST), pct(before.sst, afterCompaction.sst, baseline.sst),
		pct(before.dir, afterCompaction.dir, baseline.dir))
}
