package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

// memFS runs every store on Pebble's in-memory filesystem: syncs cost nothing, so the
// numbers isolate CPU overhead (engine vs floor) from disk noise. Profiling only: the
// real numbers are on disk.
var memFS = flag.Bool("memfs", false, "run Pebble on vfs.NewMem (CPU overhead only, no fsync)")

// concs are the concurrencies every throughput benchmark runs at.
var concs = []int{1, 8, 64}

// replayKeys is how many committed keys replay benchmarks read from.
const replayKeys = 4096

// parallel runs op b.N times in total from conc goroutines, timing only that.
// op gets the worker index and a global operation index in [0, b.N).
func parallel(b *testing.B, conc int, op func(ctx context.Context, w int, i int) error) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Bool
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(ctx, w, int(i)); err != nil {
					if failed.CompareAndSwap(false, true) {
						b.Errorf("op %d: %v", i, err)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is the CPU time (user + system) this process has used, background goroutines
// (Pebble's flushes and compactions) included. Per operation it is a steadier measure of
// overhead than wall time on a shared, loaded machine.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// openEngine opens the engine on disk in a fresh temporary directory.
// The counter counts its WAL syncs.
func openEngine(b *testing.B, mode engine.Mode, now func() time.Time) (*engine.Store, *stores.SyncCounter) {
	b.Helper()
	return openEngineWith(b, mode, now, nil)
}

// openEngineWith is openEngine with the options changed by mod (if not nil).
func openEngineWith(b *testing.B, mode engine.Mode, now func() time.Time, mod func(*receipts.Options)) (*engine.Store, *stores.SyncCounter) {
	b.Helper()
	opts := engine.Options(now)
	if mod != nil {
		mod(&opts.Options)
	}
	if *memFS {
		opts.Pebble.FS = vfs.NewMem()
	}
	syncs := stores.CountSyncs(opts.Pebble)
	s, err := engine.Open(b.TempDir(), opts, mode)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	})
	return s, syncs
}

// openFloor opens raw Pebble on disk in a fresh temporary directory. The counter counts
// its WAL syncs.
func openFloor(b *testing.B) (*stores.Floor, *stores.SyncCounter) {
	b.Helper()
	opts := stores.PebbleOptions()
	if *memFS {
		opts.FS = vfs.NewMem()
	}
	syncs := stores.CountSyncs(opts)
	f, err := stores.OpenFloor(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	})
	return f, syncs
}

// newKeys benchmarks first calls on keys never seen before, at each concurrency, and
// reports the WAL syncs per operation (below the number of synced writes when Pebble's
// group commit shares a sync among concurrent writers).
func newKeys(b *testing.B, s stores.Store, syncs *stores.SyncCounter) {
	for _, conc := range concs {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			run := workload.RunID()
			before := syncs.WAL()
			defer func() { b.ReportMetric(float64(syncs.WAL()-before)/float64(b.N), "syncs/op") }()
			parallel(b, conc, func(ctx context.Context, w, i int) error {
				k := workload.NewKey(run, w, uint64(i))
				replayed, err := s.Do(ctx, k, workload.Fingerprint(k), workload.ResultFor(k))
				if err == nil && replayed {
					err = fmt.Errorf("new key %v was replayed", k)
				}
				return err
			})
		})
	}
}

// populate commits n fixed keys of set through s, 64-way.
func populate(b *testing.B, s stores.Store, set string, n int) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				k := workload.FixedKey(set, i)
				if _, err := s.Do(context.Background(), k, workload.Fingerprint(k), workload.ResultFor(k)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// replays benchmarks retries of committed keys, at each concurrency.
func replays(b *testing.B, s stores.Store) {
	set := "replay-" + workload.RunID()
	populate(b, s, set, replayKeys)
	fps := make([][]byte, replayKeys)
	ks := make([]workload.Key, replayKeys)
	for i := range ks {
		ks[i] = workload.FixedKey(set, i)
		fps[i] = workload.Fingerprint(ks[i])
	}
	for _, conc := range concs {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			parallel(b, conc, func(ctx context.Context, w, i int) error {
				j := int(uint64(i) * 2654435761 % replayKeys) // spread over the set
				return s.Replay(ctx, ks[j], fps[j])
			})
		})
	}
}

// fakeClock is a settable clock for Options.Now.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// first drops the sync counter that openEngine and openFloor return.
func first[S stores.Store](s S, _ *stores.SyncCounter) S { return s }

// offsetClock is the wall clock moved forward by offset.
type offsetClock struct{ offset atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

var errNotReplayed = errors.New("bench: a retry of a committed key was not replayed")
