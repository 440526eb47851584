package intents_test

import (
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/internal/intentsmodel"
	"github.com/receiptstore/receipts/internal/testkit"
	"pgregory.net/rapid"
)

// TestModel runs the journal's model (intents/internal/intentsmodel) on the Pebble
// store, with crashes that keep what was synced and a random part of what
// was not. With Update's sync dropped it fails within a few checks.
func TestModel(t *testing.T) {
	checks := 200
	if testkit.Soak() {
		checks = 5000
	}
	testkit.RunRapid(t, checks, func(rt *rapid.T) {
		fs := vfs.NewCrashableMem()
		open := func(t *rapid.T) intents.Store {
			s, err := intents.OpenPebble("j", &intents.Options{Pebble: &pebble.Options{FS: fs}})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		intentsmodel.Model(rt, intentsmodel.Engine{
			Open: open,
			Crash: func(t *rapid.T) intents.Store {
				pct := rapid.SampledFrom([]int{0, 50, 100}).Draw(t, "unsynced%")
				cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: pct}
				if pct > 0 {
					cfg.RNG = rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
				}
				fs = fs.CrashClone(cfg)
				return open(t)
			},
			Reopen: open,
		})
	})
}
