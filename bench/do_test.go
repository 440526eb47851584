package bench

import (
	"testing"

	"github.com/receiptstore/receipts/bench/internal/engine"
)

// BenchmarkDo: durable DB.Do on new keys (claim synced, commit synced), next to the floor:
// raw Pebble Get + synced claim Set + synced commit Set.
func BenchmarkDo(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { newKeys(b, openEngine(b, engine.ModeDo, nil)) })
	b.Run("pebble-floor", func(b *testing.B) { newKeys(b, openFloor(b)) })
}

// BenchmarkClaimCommit: DB.Claim then Lease.Commit on new keys, next to the same floor.
func BenchmarkClaimCommit(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { newKeys(b, openEngine(b, engine.ModeClaimCommit, nil)) })
	b.Run("pebble-floor", func(b *testing.B) { newKeys(b, openFloor(b)) })
}

// BenchmarkCommitWith: DB.Claim then Lease.CommitWith writing a small effect (a 64-byte
// application row) in the commit batch; the floor puts the same row in its commit batch.
func BenchmarkCommitWith(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { newKeys(b, openEngine(b, engine.ModeCommitWith, nil)) })
	b.Run("pebble-floor", func(b *testing.B) {
		f := openFloor(b)
		f.Effect = true
		newKeys(b, f)
	})
}

// BenchmarkDoBatch: DB.DoBatch with the same small effect: the claim is not synced, the
// commit (receipt + effect) is. The floor skips the claim's sync too.
func BenchmarkDoBatch(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { newKeys(b, openEngine(b, engine.ModeDoBatch, nil)) })
	b.Run("pebble-floor", func(b *testing.B) {
		f := openFloor(b)
		f.Effect = true
		f.NoSyncClaim = true
		newKeys(b, f)
	})
}
