package bench

import (
	"path/filepath"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/keyring"
)

// BenchmarkReplay: a retry of a committed key through DB.Do (fn never runs), over 4096
// committed keys, next to the floor: one raw Pebble Get and a fingerprint check.
func BenchmarkReplay(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { replays(b, first(openEngine(b, engine.ModeDo, nil))) })
	// receipts-sealed: results encrypted (Options.Keyring), decrypted on every replay.
	b.Run("receipts-sealed", func(b *testing.B) { replays(b, first(openEngineWith(b, engine.ModeDo, nil, sealed(b)))) })
	b.Run("pebble-floor", func(b *testing.B) { replays(b, first(openFloor(b))) })
}

// sealed sets Options.Keyring to a key file in a temporary directory.
func sealed(b *testing.B) func(*receipts.Options) {
	kr, err := keyring.Create(filepath.Join(b.TempDir(), "receipts.keyring"))
	if err != nil {
		b.Fatal(err)
	}
	return func(o *receipts.Options) { o.Keyring = kr }
}

// BenchmarkReplayClaim: the same retries through DB.Claim.
func BenchmarkReplayClaim(b *testing.B) {
	b.Run("receipts", func(b *testing.B) { replays(b, first(openEngine(b, engine.ModeClaimCommit, nil))) })
	b.Run("pebble-floor", func(b *testing.B) { replays(b, first(openFloor(b))) })
}
