package bench

import (
	"testing"

	"github.com/receiptstore/receipts/bench/internal/engine"
)

// BenchmarkReplay: a retry of a committed key through DB.Do (fn never runs), over 4096
// committed keys, next to the floor: one raw Pebble Get and a fingerprint check.
func BenchmarkReplay(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { replays(b, first(openEngine(b, engine.ModeDo, nil))) })
	b.Run("pebble-floor", func(b *testing.B) { replays(b, first(openFloor(b))) })
}

// BenchmarkReplayClaim: the same retries through DB.Claim.
func BenchmarkReplayClaim(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { replays(b, first(openEngine(b, engine.ModeClaimCommit, nil))) })
	b.Run("pebble-floor", func(b *testing.B) { replays(b, first(openFloor(b))) })
}
