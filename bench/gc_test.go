package bench

import (
	"context"
	"strconv"
	"testing"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

// gcReceipts is how many receipts each GC iteration finds expired.
const gcReceipts = 1024

// BenchmarkGC: DB.GC after the receipts of one epoch expired (fake clock), timing only the
// GC call; the floor drops the same number of raw records of one epoch with one synced
// range deletion. Filling the store is not timed.
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
		var dropped int
		var writes int
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			populate(b, s, run+"-"+strconv.Itoa(i), gcReceipts)
			clk.Advance(opts.Retention + 2*width)
			b.StartTimer()
			st, err := s.DB.GC(ctx)
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
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*gcReceipts), "ns/receipt")
	})
	b.Run("pebble-floor", func(b *testing.B) {
		f, _ := openFloor(b)
		run := workload.RunID()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			f.SetEpoch(uint32(i))
			populate(b, f, run+"-"+strconv.Itoa(i), gcReceipts)
			b.StartTimer()
			if err := f.DropEpoch(uint32(i)); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*gcReceipts), "ns/receipt")
	})
}
