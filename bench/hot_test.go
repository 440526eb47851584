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
	// hotCallsPerKey: in the mixed run, each hot key gets this many calls before the next
	// key takes its slot: one first call, the rest retries (some while the first is in
	// flight, which wait for its receipt, most after it, which replay).
	hotCallsPerKey = 32
)

// BenchmarkHotKeys: 64 goroutines on 16 keys through DB.Do, next to the floor doing the
// same under its stripe lock.
//
//   - mixed: one first call per 32 calls on each key; bound by the first calls' syncs.
//   - retries: the 16 keys are committed; every call is a retry. Compare with
//     BenchmarkReplay/*/conc=64 (the same calls spread over 4096 keys): contention on
//     a few keys should not collapse it.
func BenchmarkHotKeys(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { hot(b, first(openEngine(b, engine.ModeDo, nil))) })
	b.Run("pebble-floor", func(b *testing.B) { hot(b, first(openFloor(b))) })
}

func hot(b *testing.B, s stores.Store) {
	b.Run("mixed/conc="+strconv.Itoa(hotGoroutines), func(b *testing.B) {
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
	set := "hot-" + workload.RunID()
	populate(b, s, set, hotKeys)
	var ks [hotKeys]workload.Key
	var fps [hotKeys][]byte
	for i := range ks {
		ks[i] = workload.FixedKey(set, i)
		fps[i] = workload.Fingerprint(ks[i])
	}
	b.Run("retries/conc="+strconv.Itoa(hotGoroutines), func(b *testing.B) {
		parallel(b, hotGoroutines, func(ctx context.Context, w, i int) error {
			j := i % hotKeys
			replayed, err := s.Do(ctx, ks[j], fps[j], nil)
			if err == nil && !replayed {
				err = errNotReplayed
			}
			return err
		})
	})
}
