package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
)

// crashEnvInt reads an integer knob from the environment.
func crashEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// crashSeed is the run's seed: RECEIPTS_SEED, or the time.
func crashSeed(t testing.TB) uint64 {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("RECEIPTS_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (rerun with RECEIPTS_SEED=%d)", seed, seed)
	return seed
}

func crashSoak() bool { return os.Getenv("RECEIPTS_SOAK") == "1" }

// crashTestLogger is a Pebble logger for tests: Fatalf panics (in the
// calling goroutine) instead of exiting the process, after recording the
// message.
type crashTestLogger struct {
	mu     sync.Mutex
	fatals []string
}

func (l *crashTestLogger) Infof(string, ...any)  {}
func (l *crashTestLogger) Errorf(string, ...any) {}
func (l *crashTestLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.fatals = append(l.fatals, msg)
	l.mu.Unlock()
	panic(crashFatal(msg))
}

func (l *crashTestLogger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.fatals)
}

// crashFatal is the panic value of crashTestLogger.Fatalf.
type crashFatal string

func crashOpen(t testing.TB, fs vfs.FS, clock *crashClock, logger pebble.Logger) *receipts.DB {
	t.Helper()
	db, err := receipts.Open("db", &receipts.Options{
		Retention:  crashRetention,
		LeaseTTL:   crashTTL,
		GCInterval: -1,
		Now:        clock.Now,
		Pebble:     &pebble.Options{FS: fs, Logger: logger},
	})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return db
}

// TestCrashPowerLoss runs 8 workers against a store on Pebble's crashable
// in-memory FS, takes a crash image (CrashClone) at a random moment while
// they run, reopens the image and checks it against everything that was
// acknowledged before the crash (see crash_load_test.go), then goes on
// with the next generation on the image. "p0" keeps exactly the synced
// data; "prand" keeps a seeded random 10..100% of the unsynced data.
func TestCrashPowerLoss(t *testing.T) {
	crashes := crashEnvInt("RECEIPTS_CRASHES", crashPowerLossCrashes)
	if crashSoak() {
		crashes = crashEnvInt("RECEIPTS_CRASHES", 2000)
	}
	seed := crashSeed(t)
	for i, mode := range []string{"p0", "prand"} {
		t.Run(mode, func(t *testing.T) {
			crashPowerLoss(t, seed+uint64(i), mode, crashes)
		})
	}
}

func crashPowerLoss(t *testing.T, seed uint64, mode string, crashes int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	fs := vfs.NewCrashableMem()
	clock := newCrashClock(crashStart)
	logger := &crashTestLogger{}
	rec := &crashRecorder{}
	prov := newCrashProvider()
	bad := &crashBad{}
	var total crashLoadStats
	var checks crashCheckStats
	ctx := context.Background()
	const workers = 8
	var keyBase int64
	pSum := 0

	for gen := 0; gen <= crashes; gen++ {
		db := crashOpen(t, fs, clock, logger)
		cs := crashCheck(ctx, db, rec.events(), prov.effects(), bad, gen, gen == crashes)
		checks.records += cs.records
		checks.duplicates += cs.duplicates
		checks.lostAcks += cs.lostAcks
		checks.lostClaims += cs.lostClaims
		if bad.count() > 0 || gen == crashes {
			if bad.count() == 0 {
				crashCheckTombstones(t, db, clock, rec.events())
			}
			_ = db.Close()
			break
		}

		st := &crashLoadStats{}
		crashAt := int64(20 + rng.IntN(400))
		crashed := make(chan struct{})
		load := &crashLoad{
			db: db, clock: clock, gen: gen, prov: prov, rec: rec, bad: bad, st: st,
			window: 12, base: keyBase, maxJumps: 3, doWait: 3 * time.Millisecond,
			onOpsAt: crashAt, onOps: func() { close(crashed) },
		}
		var wg sync.WaitGroup
		for w := range workers {
			wrng := rand.New(rand.NewPCG(rng.Uint64(), uint64(w)))
			wg.Go(func() { load.worker(w, wrng, 0) })
		}
		<-crashed
		// Power fails: the world stops (events after this point never
		// happened as far as anyone survives to know), the disk keeps what
		// it kept.
		mark := rec.mark()
		prov.freeze()
		cfg := vfs.CrashCloneCfg{}
		if mode == "prand" {
			cfg.UnsyncedDataPercent = 10 + rng.IntN(91)
			cfg.RNG = rand.New(rand.NewPCG(rng.Uint64(), 1))
			pSum += cfg.UnsyncedDataPercent
		}
		image := fs.CrashClone(cfg)
		load.stop.Store(true)
		wg.Wait()
		if err := db.Close(); err != nil {
			t.Fatalf("gen %d: close: %v", gen, err)
		}
		rec.cut(mark)
		prov.thaw()
		total.add(st)
		keyBase += crashAt / 8 // the next generation starts where this one crashed
		fs = image
		clock.Advance(crashTTL + time.Second) // the restart takes a while: old leases run out
	}
	if n := logger.count(); n > 0 {
		t.Errorf("pebble fatal errors: %d", n)
	}
	if bad.count() > 0 {
		t.Fatalf("%s (seed %d)", bad, seed)
	}
	if total.effects.Load() == 0 || total.takeovers.Load() == 0 || total.commits.Load() == 0 {
		t.Fatalf("workload too thin: %s", &total)
	}
	msg := fmt.Sprintf("%s: %d crashes, %s; checks: %d records examined, duplicate effects %d, lost acknowledged receipts %d, lost claims %d",
		mode, crashes, &total, checks.records, checks.duplicates, checks.lostAcks, checks.lostClaims)
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
func crashCheckTombstones(t *testing.T, db *receipts.DB, clock *crashClock, evs []crashEvent) {
	t.Helper()
	acked := map[receipts.Key]bool{}
	for _, e := range evs {
		if e.Kind == evCommitted {
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
