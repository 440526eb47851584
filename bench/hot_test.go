package bench

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

const (
	hotGoroutines = 64
	hotKeys       = 16
	// hotCallsPerKey: each hot key gets this many calls before the next key takes its
	// slot: one first call, the rest retries (some while the first is in flight, which
	// wait for its receipt, most after it, which replay).
	hotCallsPerKey = 32
)

// BenchmarkHotKeys: 64 goroutines on 16 keys through DB.Do, mixing first calls and
// retries, next to the floor doing the same under its stripe lock. Compare its ops/s
// with BenchmarkReplay/*/conc=64 (uncontended replays).
func BenchmarkHotKeys(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { hot(b, first(openEngine(b, engine.ModeDo, nil))) })
	b.Run("pebble-floor", func(b *testing.B) { hot(b, first(openFloor(b))) })
}

func hot(b *testing.B, s stores.Store) {
	b.Run("conc="+strconv.Itoa(hotGoroutines), func(b *testing.B) {
		run := workload.RunID()
		var calls [hotKeys]atomic.Uint64
		var firsts atomic.Uint64
		parallel(b, hotGoroutines, func(ctx context.Context, w, i int) error {
			slot := i % hotKeys
			gen := (calls[slot].Add(1) - 1) / hotCallsPerKey
			k := workload.FixedKey(run+"-"+strconv.FormatUint(gen, 10), slot)
			replayed, err := s.Do(ctx, k, workload.Fingerprint(k), workload.ResultFor(k))
			if err == nil && !replayed {
				firsts.Add(1)
			}
			return err
		})
		b.ReportMetric(float64(firsts.Load())/float64(b.N), "firsts/op")
	})
}
