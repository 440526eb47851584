package pgstore

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/receiptstest"
)

// Benchmarks of the engine's statements on the test server (go test -run '^$' -bench . ./pgstore).
// -cpu sets the parallelism: RunParallel runs GOMAXPROCS×8 goroutines.

func benchEngine(b *testing.B) *node {
	b.Helper()
	n := newBenchDB(b).open(engineOptions{})
	b.ResetTimer()
	return n
}

var benchSeq atomic.Int64

func BenchmarkClaim(b *testing.B) {
	e := benchEngine(b)
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := key(fmt.Sprint("c", benchSeq.Add(1)))
			if _, err := e.Claim(bg, req(k, "fp")); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkClaimFinish(b *testing.B) {
	e := benchEngine(b)
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := key(fmt.Sprint("f", benchSeq.Add(1)))
			c, err := e.Claim(bg, req(k, "fp"))
			if err == nil {
				_, err = e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("0123456789abcdef0123456789abcdef"))
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkReplay(b *testing.B) { benchReplay(b, false) }

// BenchmarkLookup is the floor of a replay: a plain read of the same records.
func BenchmarkLookup(b *testing.B) { benchReplay(b, true) }

func benchReplay(b *testing.B, lookup bool) {
	e := benchEngine(b)
	const n = 1000
	for i := 0; i < n; i++ {
		k := key(fmt.Sprint("r", i))
		c, err := e.Claim(bg, req(k, "fp"))
		if err == nil {
			_, err = e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("0123456789abcdef0123456789abcdef"))
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		i := int(benchSeq.Add(7919)) // goroutines start on different keys
		for pb.Next() {
			i++
			k := key(fmt.Sprint("r", i%n))
			if lookup {
				if _, found, _, err := e.Lookup(bg, k); err != nil || !found {
					b.Error(found, err)
					return
				}
				continue
			}
			res, err := e.Claim(bg, req(k, "fp"))
			if err != nil || res.Outcome != driver.Replay {
				b.Error(res.Outcome, err)
				return
			}
		}
	})
}

// BenchmarkWakeAcrossNodes: node A finishes a key that a waiter on node B watches; the time
// until B's channel fires, over LISTEN/NOTIFY (reported as p50 and p99 in ms). back-to-back:
// each Finish follows the previous wake-up at once, so it waits for the next coalesced flush;
// isolated: a quiet period before each Finish, whose wake-up goes out at once.
func BenchmarkWakeAcrossNodes(b *testing.B) {
	b.Run("back-to-back", func(b *testing.B) { benchWake(b, 0) })
	b.Run("isolated", func(b *testing.B) { benchWake(b, 20*time.Millisecond) })
}

func benchWake(b *testing.B, quiet time.Duration) {
	d := newBenchDB(b)
	a := d.open(engineOptions{})
	w := d.open(engineOptions{ListenConn: d.listenConn(), PollInterval: time.Hour})
	for !w.listenUp.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := key(fmt.Sprint("wake", benchSeq.Add(1)))
		c, err := a.Claim(bg, req(k, "fp"))
		if err != nil {
			b.Fatal(err)
		}
		ch, done := w.Watch(k)
		if quiet > 0 {
			b.StopTimer()
			time.Sleep(quiet)
			b.StartTimer()
		}
		start := time.Now()
		if _, err := a.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); err != nil {
			b.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			b.Fatal("no wake-up")
		}
		lat = append(lat, time.Since(start))
		done()
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
}

// BenchmarkDoTx: DoTx with an (empty) effect: claim, effect and receipt in one transaction,
// one commit flush; compare with BenchmarkClaimFinish (two commits; the engine's statements
// alone, without the DB above them).
func BenchmarkDoTx(b *testing.B) {
	db := benchOpen(b)
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := receipts.Key{Scope: "s", ID: fmt.Sprint("t", benchSeq.Add(1))}
			_, err := DoTx(bg, db, k, []byte("fp"), func(context.Context, pgx.Tx, *receipts.Lease) ([]byte, error) {
				return []byte("0123456789abcdef0123456789abcdef"), nil
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchOpen opens a DB on a fresh schema, with a pool as large as benchEngine's.
func benchOpen(b *testing.B) *receipts.DB {
	b.Helper()
	d := newBenchDB(b)
	pool := newTestPool(b, d.dsn)
	db, err := Open(bg, pool, &Options{Schema: d.schema})
	if err != nil {
		pool.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = db.Close()
		pool.Close()
	})
	b.ResetTimer()
	return db
}

// BenchmarkClaimFinishAged is BenchmarkClaimFinish on a store that has run for a whole
// Retention, so that every live epoch has its partition (Retention/EpochWidth + 1 of them,
// here 17), as in a service that has been up for a day: what a fenced write's search over the
// live partitions costs shows (epochhint.go). One caller, so that the figure is per statement
// pair rather than the server's CPU under load.
func BenchmarkClaimFinishAged(b *testing.B) {
	const width = 15 * time.Minute
	clk := receiptstest.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	n := newBenchDB(b).open(engineOptions{Retention: 4 * time.Hour, EpochWidth: width, Now: clk.Now})
	claimFinish := func(id string) {
		k := key(id)
		res, err := n.Claim(bg, req(k, "fp"))
		if err == nil {
			_, err = n.Finish(bg, k, res.Record.Token, driver.Succeeded, []byte("r"))
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 17; i++ { // one receipt in each live epoch
		claimFinish(fmt.Sprint("age", i))
		clk.Advance(width)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		claimFinish(fmt.Sprint("f", i))
	}
}

// BenchmarkDBReplay and BenchmarkDBDo: a retry of a finished key, and a first call, through
// DB.Do at one caller, with the process's CPU per call (getrusage: the client's, the server
// being other processes). docs/performance.md ("Session 23: two more shapes, and the client's
// side"): go test -run '^$' -bench 'BenchmarkDB(Replay|Do)$' -benchtime 30000x ./pgstore
func BenchmarkDBReplay(b *testing.B) {
	db := benchOpen(b)
	fn := func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("0123456789abcdef0123456789abcdef"), nil
	}
	for i := range 1000 {
		if _, err := db.Do(context.Background(), receipts.Key{Scope: "s", ID: fmt.Sprint("r", i)}, []byte("fp"), fn); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([]receipts.Key, 1000)
	for i := range keys {
		keys[i] = receipts.Key{Scope: "s", ID: fmt.Sprint("r", i)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	c0 := cpuTime()
	n := 0
	for i := 0; b.Loop(); i++ {
		if _, err := db.Do(context.Background(), keys[i%1000], []byte("fp"), fn); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(cpuTime()-c0)/float64(n)/1e3, "cpu-us/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkDBDo(b *testing.B) {
	db := benchOpen(b)
	fn := func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("0123456789abcdef0123456789abcdef"), nil
	}
	b.ReportAllocs()
	b.ResetTimer()
	c0 := cpuTime()
	n := 0
	for i := 0; b.Loop(); i++ {
		if _, err := db.Do(context.Background(), receipts.Key{Scope: "s", ID: fmt.Sprint("n", benchSeq.Add(1))}, []byte("fp"), fn); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(cpuTime()-c0)/float64(n)/1e3, "cpu-us/op")
}
