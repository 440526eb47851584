// Command gcload measures what GC costs the engine when it drops many receipts: it loads N
// receipts through 64 concurrent durable first calls, moves the store's clock past their
// retention, and then runs 64 callers' first calls on new keys for a while, calling GC once
// in the middle. It prints GC's stats (epochs dropped, the tombstone markers it wrote for the
// dropped records and their bytes, its time; per million receipts too) and the foreground
// calls' p50/p99 before, during and after GC.
//
//	go run ./cmd/gcload -n 1000000
//	go run ./cmd/gcload -n 1000000 -tombstones=false
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

func main() {
	n := flag.Int("n", 200_000, "receipts to load, then drop")
	conc := flag.Int("conc", 64, "concurrent callers loading the receipts")
	fgConc := flag.Int("fg", 64, "concurrent callers of the foreground while GC runs (0: GC alone)")
	cpuProf := flag.String("cpuprofile", "", "write a CPU profile of GC (and the foreground while it runs) to this file")
	tombs := flag.Bool("tombstones", true, "tombstones on (false: TombstoneWindow -1, GC writes no markers)")
	d := flag.Duration("d", 6*time.Second, "foreground time; GC is called after a third of it")
	dir := flag.String("dir", "", "parent directory of the store (default: the system temp dir)")
	flag.Parse()
	if err := run(*n, *conc, *fgConc, *tombs, *d, *dir, *cpuProf); err != nil {
		fmt.Fprintln(os.Stderr, "gcload:", err)
		os.Exit(1)
	}
}

func run(n, conc, fgConc int, tombs bool, d time.Duration, parent, cpuProf string) error {
	dir, err := os.MkdirTemp(parent, "gcload")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var offset atomic.Int64 // the store's clock: the wall clock moved forward by offset
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	o := engine.Options(now)
	if !tombs {
		o.TombstoneWindow = -1
	}
	s, err := engine.Open(dir, o, engine.ModeDo)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx := context.Background()

	run := workload.RunID()
	var next atomic.Uint64
	t0 := time.Now()
	load := workload.Run(ctx, conc, 0, uint64(n), func(ctx context.Context, _ int, _ uint64) error {
		k := workload.FixedKey(run, int(next.Add(1)-1))
		_, err := s.Do(ctx, k, workload.Fingerprint(k), workload.ResultFor(k))
		return err
	})
	if load.FirstErr != nil {
		return load.FirstErr
	}
	fmt.Printf("loaded %d receipts in %.1fs (%.0f/s)\n", n, time.Since(t0).Seconds(), float64(n)/time.Since(t0).Seconds())
	width := s.DB.Options().EpochWidth
	offset.Add(int64(o.Retention + width + time.Second)) // every loaded epoch dead

	// The foreground: first calls on new keys, their latency kept by phase.
	const before, during, after = 0, 1, 2
	var phase atomic.Int32
	var stop atomic.Bool
	hists := make([][3]workload.Hist, fgConc)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	fg := workload.RunID()
	for w := range fgConc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(0); !stop.Load(); i++ {
				k := workload.NewKey(fg, w, i)
				p := phase.Load()
				start := time.Now()
				if _, err := s.Do(ctx, k, workload.Fingerprint(k), workload.ResultFor(k)); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				if q := phase.Load(); q == p { // an op that straddles a phase change counts in neither
					hists[w][p].Record(time.Since(start))
				}
			}
		}()
	}
	time.Sleep(d / 3)
	if cpuProf != "" {
		f, err := os.Create(cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	phase.Store(during)
	cpu0 := cpuTime()
	st, gerr := s.DB.GC(ctx)
	gcCPU := cpuTime() - cpu0
	phase.Store(after)
	if cpuProf != "" {
		pprof.StopCPUProfile()
	}
	time.Sleep(d / 3)
	stop.Store(true)
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	if gerr != nil {
		return gerr
	}
	perM := 1e6 / float64(n)
	fmt.Printf("process CPU while GC ran: %s (foreground included)\n", gcCPU.Round(time.Millisecond))
	fmt.Printf("GC (tombstones %v): %d epochs dropped, %d writes, %d markers written (%s, %.1f bytes per receipt), %s (%s per million receipts)\n",
		tombs, st.EpochsDropped, st.Writes, st.MarkersWritten, mib(st.MarkerBytes), float64(st.MarkerBytes)/float64(n),
		st.Duration.Round(time.Millisecond), time.Duration(float64(st.Duration)*perM).Round(time.Millisecond))
	for p, name := range []string{"before GC", "during GC", "after GC"} {
		var h workload.Hist
		for w := range hists {
			h.Merge(&hists[w][p])
		}
		fmt.Printf("  foreground %-9s %7d calls  p50 %-8s p99 %-8s max %s\n", name, h.Count(),
			h.Quantile(0.5).Round(time.Microsecond), h.Quantile(0.99).Round(time.Microsecond), h.Max().Round(time.Microsecond))
	}
	return nil
}

// cpuTime is this process's CPU time (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
