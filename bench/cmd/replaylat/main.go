// Command replaylat replays committed keys through DB.Do on the engine, on disk with
// the benchmarks' options, and prints the replays' latency distribution, the
// collections during the run, and how many replays the replay cache answered
// (Stats.ReplayCacheHits). receiptbench gives ratios against the floor and the
// peers; this is for what makes a tail: a replay the cache does not answer reads
// Pebble and takes several times as long as one it does.
//
//	go run ./cmd/replaylat -keys 10000 -conc 1 -ops 2000000
//	go run ./cmd/replaylat -keys 10000 -conc 64
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

func main() {
	n := flag.Int("keys", 10000, "committed keys to replay (the replay benchmark's 10000 by default)")
	conc := flag.Int("conc", 1, "concurrent callers")
	ops := flag.Int("ops", 400000, "replays in all")
	dir := flag.String("dir", "", "parent directory of the store (default: the system temp dir)")
	flag.Parse()
	if *n <= 0 || *conc <= 0 || *ops <= 0 {
		fmt.Fprintln(os.Stderr, "replaylat: -keys, -conc and -ops must be positive")
		os.Exit(2)
	}
	if err := run(*n, *conc, *ops, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "replaylat:", err)
		os.Exit(1)
	}
}

func run(n, conc, ops int, parent string) error {
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

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	hits := s.DB.Stats().ReplayCacheHits
	res := workload.Run(ctx, conc, 0, uint64(ops), func(ctx context.Context, w int, seq uint64) error {
		j := int((seq*uint64(conc)+uint64(w))*7919) % n // spread over the keys
		return s.Replay(ctx, keys[j], fps[j])
	})
	runtime.ReadMemStats(&after)
	if res.FirstErr != nil {
		return res.FirstErr
	}
	hits = s.DB.Stats().ReplayCacheHits - hits
	fmt.Printf("%d replays of %d keys, %d-way: %.0f replays/s; p50 %v, p99 %v, p99.9 %v, max %v\n",
		res.Ops, n, conc, res.OpsPerSec(), res.Hist.Quantile(0.5), res.Hist.Quantile(0.99), res.Hist.Quantile(0.999), res.Hist.Max())
	fmt.Printf("replay cache answered %d (missed %.2f%%); %d collections\n",
		hits, 100*float64(res.Ops-hits)/float64(res.Ops), after.NumGC-before.NumGC)
	return nil
}
