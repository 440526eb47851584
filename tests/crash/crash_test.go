package crash_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/receiptstore/receipts/tests/internal/workload"
)

// TestCrashPowerLoss runs 8 workers against a store on Pebble's crashable
// in-memory FS, takes a crash image (CrashClone) at a random moment while
// they run, reopens the image and checks it against everything that was
// acknowledged before the crash (see tests/internal/workload), then goes on
// with the next generation on the image. "p0" keeps exactly the synced
// data; "prand" keeps a seeded random 10..100% of the unsynced data.
func TestCrashPowerLoss(t *testing.T) {
	crashes := testkit.EnvInt("RECEIPTS_CRASHES", crashPowerLossCrashes)
	if testkit.Soak() {
		crashes = testkit.EnvInt("RECEIPTS_CRASHES", 2000)
	}
	seed := testkit.Seed(t)
	for i, mode := range []string{"p0", "prand"} {
		t.Run(mode, func(t *testing.T) {
			crashPowerLoss(t, seed+uint64(i), mode, crashes)
		})
	}
}

func crashPowerLoss(t *testing.T, seed uint64, mode string, crashes int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	fs := vfs.NewCrashableMem()
	clock := receiptstest.NewClock(workload.Start)
	logger := &workload.TestLogger{}
	rec := &workload.Recorder{}
	prov := workload.NewProvider()
	bad := &workload.Bad{}
	var total workload.LoadStats
	var checks workload.CheckStats
	ctx := context.Background()
	const workers = 8
	var keyBase int64
	pSum := 0

	for gen := 0; gen <= crashes; gen++ {
		db := workload.Open(t, fs, clock, logger)
		cs := workload.Check(ctx, db, rec.Events(), prov.Effects(), bad, gen, gen == crashes)
		checks.Records += cs.Records
		checks.Duplicates += cs.Duplicates
		checks.LostAcks += cs.LostAcks
		checks.LostClaims += cs.LostClaims
		if bad.Count() > 0 || gen == crashes {
			if bad.Count() == 0 {
				crashCheckTombstones(t, db, clock, rec.Events())
			}
			_ = db.Close()
			break
		}

		st := &workload.LoadStats{}
		crashAt := int64(20 + rng.IntN(400))
		crashed := make(chan struct{})
		load := &workload.Load{
			DB: db, Clock: clock, Gen: gen, Prov: prov, Rec: rec, Bad: bad, St: st,
			Window: 12, Base: keyBase, MaxJumps: 3, DoWait: 3 * time.Millisecond,
			OnOpsAt: crashAt, OnOps: func() { close(crashed) },
		}
		var wg sync.WaitGroup
		for w := range workers {
			wrng := rand.New(rand.NewPCG(rng.Uint64(), uint64(w)))
			wg.Go(func() { load.Worker(w, wrng, 0) })
		}
		<-crashed
		// Power fails: the world stops (events after this point never
		// happened as far as anyone survives to know), the disk keeps what
		// it kept.
		mark := rec.Mark()
		prov.Freeze()
		cfg := vfs.CrashCloneCfg{}
		if mode == "prand" {
			cfg.UnsyncedDataPercent = 10 + rng.IntN(91)
			cfg.RNG = rand.New(rand.NewPCG(rng.Uint64(), 1))
			pSum += cfg.UnsyncedDataPercent
		}
		image := fs.CrashClone(cfg)
		load.Stop.Store(true)
		wg.Wait()
		if err := db.Close(); err != nil {
			t.Fatalf("gen %d: close: %v", gen, err)
		}
		rec.Cut(mark)
		prov.Thaw()
		total.Add(st)
		keyBase += crashAt / 8 // the next generation starts where this one crashed
		fs = image
		clock.Advance(workload.TTL + time.Second) // the restart takes a while: old leases run out
	}
	if n := logger.Count(); n > 0 {
		t.Errorf("pebble fatal errors: %d", n)
	}
	if bad.Count() > 0 {
		t.Fatalf("%s (seed %d)", bad, seed)
	}
	if total.Effects.Load() == 0 || total.Takeovers.Load() == 0 || total.Commits.Load() == 0 {
		t.Fatalf("workload too thin: %s", &total)
	}
	msg := fmt.Sprintf("%s: %d crashes, %s; checks: %d records examined, duplicate effects %d, lost acknowledged receipts %d, lost claims %d",
		mode, crashes, &total, checks.Records, checks.Duplicates, checks.LostAcks, checks.LostClaims)
	if mode == "prand" && crashes > 0 {
		msg += fmt.Sprintf(", mean unsynced kept %d%%", pSum/crashes)
	}
	t.Log(msg)
}

// crashCheckTombstones: after the last crash, every receipt acknowledged in
// any generation leaves a tombstone past its retention, as durable as the
// receipt was: once the clock has moved past Retention and GC has dropped
// the records' epochs, a claim of each such key, with any fingerprint, gets
// ErrExpired.
func crashCheckTombstones(t *testing.T, db *receipts.DB, clock *receiptstest.Clock, evs []workload.Event) {
	t.Helper()
	acked := map[receipts.Key]bool{}
	for _, e := range evs {
		if e.Kind == workload.EvCommitted {
			acked[e.Key] = true
		}
	}
	clock.Advance(db.Options().Retention + db.Options().EpochWidth)
	if _, err := db.GC(context.Background()); err != nil {
		t.Fatalf("gc: %v", err)
	}
	for k := range acked {
		if _, _, err := db.Claim(context.Background(), k, []byte("another intent")); !errors.Is(err, receipts.ErrExpired) {
			t.Errorf("%s: acknowledged before a crash, past retention: got %v, want ErrExpired", k, err)
		}
	}
	t.Logf("%d acknowledged receipts leave a tombstone after the crashes", len(acked))
}
