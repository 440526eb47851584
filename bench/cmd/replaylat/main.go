// Command replaylat replays committed keys through DB.Do on the engine, on disk with
// the benchmarks' options, and prints the replays' latency distribution, the
// collections during the run, and how many replays the replay cache answered
// (Stats.ReplayCacheHits). receiptbench gives ratios against the floor and the
// peers; this is for what makes a tail: a replay the cache does not answer reads
// Pebble and takes several times as long as one it does.
//
//	go run ./cmd/replaylat -keys 10000 -conc 1
//	go run ./cmd/replaylat -keys 10000 -conc 64
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

func main() {
	n := flag.Int("keys", 10000, "committed keys to replay (the replay benchmark's 10000 by default)")
	conc := flag.Int("conc", 1, "concurrent callers")
	ops := flag.Int("ops", 400000, "replays per caller")
	slow := flag.Duration("slow", 4*time.Microsecond, "report the share of replays slower than this")
	dir := flag.String("dir", "", "parent directory of the store (default: the system temp dir)")
	flag.Parse()
	if *n <= 0 || *conc <= 0 || *ops <= 0 {
		fmt.Fprintln(os.Stderr, "replaylat: -keys, -conc and -ops must be positive")
		os.Exit(2)
	}
	if err := run(*n, *conc, *ops, *slow, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "replaylat:", err)
		os.Exit(1)
	}
}

func run(n, conc, ops int, slow time.Duration, parent string) error {
	dir, err := os.MkdirTemp(parent, "replaylat")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, err := engine.Open(dir, nil, engine.ModeDo)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx := context.Background()
	keys := make([]workload.Key, n)
	fps := make([][]byte, n)
	for i := range keys {
		keys[i] = workload.FixedKey("replaylat", i)
		fps[i] = workload.Fingerprint(keys[i])
		if _, err := s.Do(ctx, keys[i], fps[i], workload.ResultFor(keys[i])); err != nil {
			return err
		}
	}
	if err := s.Settle(); err != nil { // as receiptbench does before its replays
		return err
	}

	lat := make([]time.Duration, conc*ops)
	errs := make([]error, conc)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	hits := s.DB.Stats().ReplayCacheHits
	start := time.Now()
	var wg sync.WaitGroup
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g * ops; i < (g+1)*ops; i++ {
				j := (i * 7919) % n // spread over the keys, each caller on its own
				t := time.Now()
				if err := s.Replay(ctx, keys[j], fps[j]); err != nil {
					errs[g] = err
					return
				}
				lat[i] = time.Since(t)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	hits = s.DB.Stats().ReplayCacheHits - hits
	slower := 0
	for _, l := range lat {
		if l > slow {
			slower++
		}
	}
	slices.Sort(lat)
	total := len(lat)
	fmt.Printf("%d replays of %d keys, %d-way: %.0f replays/s; p50 %v, p99 %v, p99.9 %v; slower than %v: %d (%.2f%%)\n",
		total, n, conc, float64(total)/elapsed.Seconds(), lat[total/2], lat[total*99/100], lat[total*999/1000],
		slow, slower, 100*float64(slower)/float64(total))
	fmt.Printf("replay cache answered %d (missed %.2f%%); %d collections\n",
		hits, 100*float64(uint64(total)-hits)/float64(total), after.NumGC-before.NumGC)
	return nil
}
