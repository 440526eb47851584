// Command lsmload loads N new keys into one store through 64 concurrent first calls and
// prints what Pebble did for them: WAL bytes, flushes, compactions and the bytes
// compactions wrote, with the ops/s and the process's CPU time. Keys are spread over the
// key space (a multiplicative hash of the sequence number), so every flush overlaps the
// whole store, as with random operation keys.
//
//	go run ./cmd/lsmload -store receipts -n 300000
//	go run ./cmd/lsmload -store pebble-floor -n 300000
//	go run ./cmd/lsmload -store receipts-tombstones-off -n 300000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/internal/peek"
)

func main() {
	store := flag.String("store", "receipts", "pebble-floor, receipts or receipts-tombstones-off")
	n := flag.Int("n", 300000, "new keys to load")
	conc := flag.Int("conc", 64, "concurrent callers")
	dir := flag.String("dir", "", "parent directory of the store (default: the system temp dir)")
	levels := flag.Bool("levels", false, "also print Pebble's metrics table (per level: tables, bytes in, compacted, write amplification)")
	lbase := flag.Int64("lbase", 0, "Pebble's LBaseMaxBytes for the store (0: the benchmarks' options, receipts.DefaultLBaseMaxBytes; Pebble's own default is 67108864)")
	flag.Parse()
	if err := run(*store, *n, *conc, *dir, *levels, *lbase); err != nil {
		fmt.Fprintln(os.Stderr, "lsmload:", err)
		os.Exit(1)
	}
}

// tuned is the benchmarks' Pebble options, with LBaseMaxBytes set to lbase if positive
// (-lbase).
func tuned(lbase int64) *pebble.Options {
	o := stores.PebbleOptions()
	if lbase > 0 {
		o.LBaseMaxBytes = lbase
	}
	return o
}

func run(name string, n, conc int, parent string, levels bool, lbase int64) error {
	dir, err := os.MkdirTemp(parent, "lsmload")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var s stores.Store
	var db *pebble.DB
	switch name {
	case "pebble-floor":
		f, err := stores.OpenFloor(dir, tuned(lbase))
		if err != nil {
			return err
		}
		s, db = f, f.DB
	case "receipts", "receipts-tombstones-off":
		o := engine.Options(nil)
		o.Pebble = tuned(lbase)
		if name == "receipts-tombstones-off" {
			o.TombstoneWindow = -1
		}
		e, err := engine.Open(dir, o, engine.ModeDo)
		if err != nil {
			return err
		}
		s, db = e, peek.Pebble(e.DB)
	default:
		return fmt.Errorf("unknown store %q", name)
	}
	defer s.Close()

	fp := make([]byte, 32)
	result := []byte("result-ok-0123456789")
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, conc)
	cpu0 := cpuTime()
	start := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				k := workload.Key{Scope: "tenant-1", ID: fmt.Sprintf("op-%016x", uint64(i)*0x9E3779B97F4A7C15)}
				if _, err := s.Do(context.Background(), k, fp, result); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	if err := errors.Join(errs...); err != nil {
		return err
	}
	m := db.Metrics()
	fmt.Printf("%s: %d new keys, %d callers: %.0f ops/s, CPU %.1f s (%.1f µs/op)\n",
		name, n, conc, float64(n)/elapsed.Seconds(), cpu.Seconds(), float64(cpu.Microseconds())/float64(n))
	fmt.Printf("  WAL in %.1f MB (%.0f B/op); flushes %d; compactions %d, written %.1f MB\n",
		float64(m.WAL.BytesIn)/1e6, float64(m.WAL.BytesIn)/float64(n), m.Flush.Count, m.Compact.Count,
		float64(m.Total().TableBytesCompacted)/1e6)
	if levels {
		fmt.Println(m.String())
	}
	return nil
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
