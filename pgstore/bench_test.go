package pgstore

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/receiptstore/receipts/driver"
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
