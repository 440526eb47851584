// Command groupcommit measures whether combining concurrent callers' synced writes into one
// Pebble batch, in front of Pebble's own commit pipeline, saves anything: what pgstore's
// combiner does for PostgreSQL (pgstore/combiner.go), tried on raw Pebble.
//
// Each operation is what a first call writes: two synced batches (the claim, then the
// commit), each of two keys (a record and its tombstone marker). In mode each, every
// caller commits its own batch (what the engine does); in mode comb, callers that arrive
// while -k combined batches are in flight wait, and the next caller to find room writes all
// of them as one batch and one sync, and answers each with that commit's outcome. It prints
// ops/s, process CPU per operation and the WAL syncs per operation (records per sync: 2 over
// it).
//
//	go run ./cmd/groupcommit -mode each -conc 64
//	go run ./cmd/groupcommit -mode comb -k 4 -conc 64
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/receiptstore/receipts/bench/internal/stores"
)

func main() {
	mode := flag.String("mode", "each", "each (a batch per caller) or comb (concurrent callers' writes combined into one batch)")
	conc := flag.Int("conc", 64, "callers")
	k := flag.Int("k", 2, "comb: combined batches in flight before callers wait to be combined")
	dur := flag.Duration("d", 3*time.Second, "measured time")
	flag.Parse()
	if *mode != "each" && *mode != "comb" || *conc < 1 || *k < 1 {
		fmt.Fprintln(os.Stderr, "groupcommit: bad flags")
		os.Exit(2)
	}
	if err := run(*mode, *conc, *k, *dur); err != nil {
		fmt.Fprintln(os.Stderr, "groupcommit:", err)
		os.Exit(1)
	}
}

func run(mode string, conc, k int, dur time.Duration) error {
	dir, err := os.MkdirTemp("", "groupcommit-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	o := stores.PebbleOptions()
	syncs := stores.CountSyncs(o)
	db, err := pebble.Open(dir, o)
	if err != nil {
		return err
	}
	defer db.Close()
	c := &combiner{db: db, k: k}
	var ops atomic.Uint64
	var failed atomic.Pointer[error]
	stop := time.Now().Add(dur)
	cpu0, syncs0, t0 := cpuTime(), syncs.WAL(), time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := make([]byte, 200)
			for i := 0; time.Now().Before(stop) && failed.Load() == nil; i++ {
				key := binary.BigEndian.AppendUint64([]byte("r"), uint64(w)<<32|uint64(i))
				for range 2 { // the claim, then the commit
					var err error
					if mode == "each" {
						b := db.NewBatch()
						write(b, key, v)
						err = b.Commit(pebble.Sync)
						_ = b.Close()
					} else {
						err = c.do(&call{key: key, value: v, done: make(chan struct{})})
					}
					if err != nil {
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	el, n := time.Since(t0), ops.Load()
	fmt.Printf("%-4s k=%d conc=%-4d ops/s %8.0f  cpu-µs/op %6.1f  syncs/op %.3f\n", mode, k, conc,
		float64(n)/el.Seconds(), float64((cpuTime()-cpu0).Microseconds())/float64(n), float64(syncs.WAL()-syncs0)/float64(n))
	return nil
}

// write adds one caller's write to b: its record and its marker.
func write(b *pebble.Batch, key, value []byte) {
	_ = b.Set(key, value, nil)
	_ = b.Set(append(key[:len(key):len(key)], 'm'), value[:8], nil)
}

// call is one caller's write, waiting for or in a combined batch.
type call struct {
	key, value []byte
	done       chan struct{} // closed when answered, or made the next leader
	err        error
	lead       []*call // set when made the next leader: the batch to write
}

// combiner writes concurrent callers' writes as one synced batch, with up to k batches in
// flight (pgstore's combiner, without the keys' deduplication: every key here is new).
type combiner struct {
	db       *pebble.DB
	k        int
	mu       sync.Mutex
	queue    []*call
	inflight int
}

func (c *combiner) do(x *call) error {
	c.mu.Lock()
	if c.inflight < c.k {
		c.inflight++
		batch := append(c.queue, x)
		c.queue = nil
		c.mu.Unlock()
		c.run(x, batch)
		return x.err
	}
	c.queue = append(c.queue, x)
	c.mu.Unlock()
	<-x.done
	if x.lead != nil {
		c.run(x, x.lead)
	}
	return x.err
}

// run writes batch as one synced batch, answers its members with the commit's outcome, then
// makes the first waiting caller the next leader with everything queued, or leaves the
// in-flight count one lower.
func (c *combiner) run(self *call, batch []*call) {
	b := c.db.NewBatch()
	for _, x := range batch {
		write(b, x.key, x.value)
	}
	err := b.Commit(pebble.Sync)
	_ = b.Close()
	for _, x := range batch {
		x.err = err
		if x != self {
			close(x.done)
		}
	}
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.inflight--
		c.mu.Unlock()
		return
	}
	next := c.queue[0]
	next.lead = c.queue
	c.queue = nil
	c.mu.Unlock()
	close(next.done)
}

// cpuTime is this process's CPU time (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
