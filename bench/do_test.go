package bench

import (
	"testing"

	"github.com/receiptstore/receipts"

	"github.com/receiptstore/receipts/bench/internal/engine"
)

// BenchmarkDo: durable DB.Do on new keys (claim synced, commit synced), next to the floor:
// raw Pebble Get + synced claim Set + synced commit Set.
func BenchmarkDo(b *testing.B) {
	b.Run("receipts", func(b *testing.B) {
		s, syncs := openEngine(b, engine.ModeDo, nil)
		newKeys(b, s, syncs)
	})
	// receipts-aged: the same on a store older than Retention, so that every live epoch
	// (Retention/EpochWidth + 1 of them) is probed to see that a new key is absent.
	b.Run("receipts-aged", func(b *testing.B) {
		clk := &offsetClock{}
		s, syncs := openEngine(b, engine.ModeDo, clk.Now)
		clk.offset.Store(int64(2 * engine.Options(nil).Retention))
		newKeys(b, s, syncs)
	})
	// receipts-tombstones-off: the same with Options.TombstoneWindow < 0 (no
	// tombstone marker written with each claim and commit): the cost of
	// tombstones is receipts next to it.
	b.Run("receipts-tombstones-off", func(b *testing.B) {
		s, syncs := openEngineWith(b, engine.ModeDo, nil, func(o *receipts.Options) { o.TombstoneWindow = -1 })
		newKeys(b, s, syncs)
	})
	b.Run("receipts-aged-tombstones-off", func(b *testing.B) {
		clk := &offsetClock{}
		s, syncs := openEngineWith(b, engine.ModeDo, clk.Now, func(o *receipts.Options) { o.TombstoneWindow = -1 })
		clk.offset.Store(int64(2 * engine.Options(nil).Retention))
		newKeys(b, s, syncs)
	})
	// receipts-sealed: results encrypted (Options.Keyring): the cost of encryption is
	// receipts next to it.
	b.Run("receipts-sealed", func(b *testing.B) {
		s, syncs := openEngineWith(b, engine.ModeDo, nil, sealed(b))
		newKeys(b, s, syncs)
	})
	b.Run("pebble-floor", func(b *testing.B) {
		f, syncs := openFloor(b)
		newKeys(b, f, syncs)
	})
}

// BenchmarkClaimCommit: DB.Claim then Lease.Commit on new keys, next to the same floor.
func BenchmarkClaimCommit(b *testing.B) {
	b.Run("receipts", func(b *testing.B) {
		s, syncs := openEngine(b, engine.ModeClaimCommit, nil)
		newKeys(b, s, syncs)
	})
	b.Run("pebble-floor", func(b *testing.B) {
		f, syncs := openFloor(b)
		newKeys(b, f, syncs)
	})
}

// BenchmarkCommitWith: DB.Claim then Lease.CommitWith writing a small effect (a 64-byte
// application row) in the commit batch; the floor puts the same row in its commit batch.
func BenchmarkCommitWith(b *testing.B) {
	b.Run("receipts", func(b *testing.B) {
		s, syncs := openEngine(b, engine.ModeCommitWith, nil)
		newKeys(b, s, syncs)
	})
	b.Run("pebble-floor", func(b *testing.B) {
		f, syncs := openFloor(b)
		f.Effect = true
		newKeys(b, f, syncs)
	})
}

// BenchmarkDoBatch: DB.DoBatch with the same small effect: the claim is not synced, the
// commit (receipt + effect) is. The floor skips the claim's sync too.
func BenchmarkDoBatch(b *testing.B) {
	b.Run("receipts", func(b *testing.B) {
		s, syncs := openEngine(b, engine.ModeDoBatch, nil)
		newKeys(b, s, syncs)
	})
	b.Run("pebble-floor", func(b *testing.B) {
		f, syncs := openFloor(b)
		f.Effect = true
		f.NoSyncClaim = true
		newKeys(b, f, syncs)
	})
}
