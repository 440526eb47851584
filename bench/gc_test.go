package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

// gcReceipts is how many receipts each GC iteration finds expired.
const gcReceipts = 1024

// BenchmarkGC: DB.GC after the receipts of one epoch expired (fake clock); the floor drops
// the same number of raw records of one epoch with one synced range deletion.
//
// Each iteration first fills the store (1024 durable first calls), then collects. The
// benchmark timer runs over both, so that `go test -bench` picks a small b.N (a timer
// stopped during the fill would make it pick thousands of iterations, each with its
// fill); the GC alone is reported as gc-ns/op and gc-ns/receipt.
func BenchmarkGC(b *testing.B) {
	b.Run("receipts", func(b *testing.B) {
		clk := newFakeClock()
		opts := engine.Options(clk.Now)
		s, err := engine.Open(b.TempDir(), opts, engine.ModeDo)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		width := opts.Retention / 4 // the engine's default epoch width
		run := workload.RunID()
		ctx := context.Background()
		var dropped, writes int
		var gc time.Duration
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			populate(b, s, run+"-"+strconv.Itoa(i), gcReceipts)
			clk.Advance(opts.Retention + 2*width)
			t0 := time.Now()
			st, err := s.DB.GC(ctx)
			gc += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if st.EpochsDropped == 0 {
				b.Fatalf("GC dropped nothing: %+v", st)
			}
			dropped += st.EpochsDropped
			writes += st.Writes
		}
		b.StopTimer()
		b.ReportMetric(float64(dropped)/float64(b.N), "epochs/op")
		b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
		reportGC(b, gc)
	})
	b.Run("pebble-floor", func(b *testing.B) {
		f, _ := openFloor(b)
		run := workload.RunID()
		var gc time.Duration
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			f.SetEpoch(uint32(i))
			populate(b, f, run+"-"+strconv.Itoa(i), gcReceipts)
			t0 := time.Now()
			if err := f.DropEpoch(uint32(i)); err != nil {
				b.Fatal(err)
			}
			gc += time.Since(t0)
		}
		b.StopTimer()
		reportGC(b, gc)
	})
}

func reportGC(b *testing.B, gc time.Duration) {
	b.ReportMetric(float64(gc.Nanoseconds())/float64(b.N), "gc-ns/op")
	b.ReportMetric(float64(gc.Nanoseconds())/float64(b.N*gcReceipts), "gc-ns/receipt")
}
