package fault_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/peek"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/receiptstore/receipts/tests/internal/workload"
)

func faultInjected(err error) bool {
	return err != nil && (errors.Is(err, errorfs.ErrInjected) || strings.Contains(err.Error(), "injected error"))
}

// faultCut is the history a process that died at mark leaves: events
// before mark, and after it only attempts, releases begun and rejections.
func faultCut(evs []workload.Event, mark int) []workload.Event {
	out := append([]workload.Event(nil), evs[:mark]...)
	for _, e := range evs[mark:] {
		if e.Kind == workload.EvAttempt || e.Kind == workload.EvRejected || e.Kind == workload.EvReleasing {
			out = append(out, e)
		}
	}
	return out
}

// faultKStats sums up TestFaultWriteErrorAtK.
type faultKStats struct {
	runs, fatal, errReturned, silent int
	imageChecks, survivorChecks      int
	load                             workload.LoadStats
}

// TestFaultWriteErrorAtK runs a seeded single-worker workload (claims,
// commits, fails, releases, renewals, Do, DoBatch, lookups, clock jumps)
// once for every k = 0, 1, 2, ..., failing the k-th write-class file
// operation (write, sync, create, rename, remove, ...) with an injected
// error, until a run finishes without reaching k. For each k:
//
//   - the image of the disk at the fault (only synced data for even k, a
//     seeded random 10..100% of unsynced data for odd k), reopened, is
//     checked against what was acknowledged before the fault: a process
//     that died there loses nothing it acknowledged;
//   - the process that lived on (after an error returned to it, it stops
//     its workload; after Pebble's Fatalf it is dead and its disk is what
//     the OS had) is reopened and checked against everything it saw.
//
// The workload's seed changes with k, so that the faults land in many
// different runs. One worker: after Pebble's Fatalf, other committers
// would wait forever on the wedged commit pipeline.
func TestFaultWriteErrorAtK(t *testing.T) {
	seed := testkit.Seed(t)
	ops := faultOps
	if testkit.Soak() {
		ops = 600
	}
	var st faultKStats
	k := 0
	for ; ; k++ {
		if !faultRunAtK(t, seed, k, ops, &st) {
			break
		}
		if t.Failed() {
			t.Fatalf("k=%d (seed %d)", k, seed)
		}
	}
	t.Logf("k = 0..%d: %d runs with a fault (%d fatal: Fatalf or panic, %d returned as errors, %d absorbed by Pebble), %d disk images checked, %d survivor stores checked; workload: %s",
		k, st.runs, st.fatal, st.errReturned, st.silent, st.imageChecks, st.survivorChecks, &st.load)
	if st.fatal == 0 || st.imageChecks == 0 {
		t.Fatalf("the faults never bit")
	}
}

// faultRunAtK runs the workload with a fault at the k-th write and checks
// both outcomes. It returns false if the run never reached the k-th write.
func faultRunAtK(t *testing.T, seed uint64, k, ops int, st *faultKStats) bool {
	t.Helper()
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	clock := receiptstest.NewClock(workload.Start)
	rec := &workload.Recorder{}
	prov := workload.NewProvider()
	bad := &workload.Bad{}

	var (
		armed      atomic.Bool // counting starts once Open has returned
		writes     atomic.Int64
		hit        atomic.Bool
		image      *vfs.MemFS // the disk when the fault hit
		markFault  int        // events acknowledged before the fault
		fxFault    int        // effects performed before the fault
		deathImage *vfs.MemFS // the disk when Pebble's Fatalf ran
		markDeath  int
		fxDeath    int
	)
	imgRNG := rand.New(rand.NewPCG(seed, uint64(k)))
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !armed.Load() || op.Kind.ReadOrWrite() != errorfs.OpIsWrite || writes.Add(1)-1 != int64(k) {
			return nil
		}
		cfg := vfs.CrashCloneCfg{}
		if k%2 == 1 {
			cfg.UnsyncedDataPercent = 10 + imgRNG.IntN(91)
			cfg.RNG = imgRNG
		}
		markFault, fxFault = rec.Mark(), len(prov.Effects())
		image = mem.CrashClone(cfg)
		hit.Store(true)
		return errorfs.ErrInjected
	})
	logger := &faultLogger{onFatal: func() {
		// The process exits here: the OS keeps every byte written so far.
		markDeath, fxDeath = rec.Mark(), len(prov.Effects())
		deathImage = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: imgRNG})
	}}
	opts := &pebblestore.Options{
		Options: receipts.Options{
			Retention:  workload.Retention,
			LeaseTTL:   workload.TTL,
			GCInterval: -1,
			Now:        clock.Now,
		},
		Pebble: &pebble.Options{FS: errorfs.Wrap(mem, inj), Logger: logger},
	}

	db, err := pebblestore.Open("db", opts)
	if err != nil {
		t.Fatalf("k=%d: open: %v", k, err)
	}
	armed.Store(true)
	var load *workload.Load
	var fatal bool
	lst := &workload.LoadStats{}
	defer st.load.Add(lst)
	{
		load = &workload.Load{
			DB: db, Clock: clock, Prov: prov, Rec: rec, Bad: bad, St: lst,
			Window: 6, MaxJumps: 4, DoWait: time.Millisecond,
			Expected: func(err error) bool { return hit.Load() && faultInjected(err) },
		}
		rng := rand.New(rand.NewPCG(seed, uint64(k))) // a different workload for every k
		fatal = faultCatch(func() { load.Worker(0, rng, ops) })
	}
	closed := false
	if !hit.Load() {
		if fatal {
			t.Fatalf("k=%d: fatal error without a fault", k)
		}
		// Close is part of the run: it writes too.
		var err error
		fatal = faultCatch(func() { err = db.Close() }) // releases Pebble even if it panics
		closed = true
		if !hit.Load() {
			// The run never reached the k-th write: done.
			if err != nil || fatal {
				t.Fatalf("k=%d: close: %v (fatal %v)", k, err, fatal)
			}
			return false
		}
		if err != nil && !faultInjected(err) {
			t.Errorf("k=%d: close: %v", k, err)
		}
	}
	st.runs++
	switch {
	case fatal:
		st.fatal++
	case load.Stop.Load():
		st.errReturned++
	default:
		st.silent++
	}
	if bad.Count() > 0 {
		t.Errorf("k=%d: workload: %s", k, bad)
	}

	// The survivor: closed cleanly, or dead at Fatalf.
	survivor := vfs.FS(mem)
	evsSurvivor, fxSurvivor := rec.Events(), prov.Effects()
	if fatal && deathImage == nil { // a panic without Fatalf: the process dies now
		markDeath, fxDeath = rec.Mark(), len(prov.Effects())
		deathImage = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: imgRNG})
	}
	switch {
	case fatal:
		// The process would be gone; Pebble's commit pipeline is wedged.
		// Close what can be closed so that no goroutine leaks.
		if !closed {
			faultClose(db)
		}
		survivor = deathImage
		evsSurvivor, fxSurvivor = faultCut(evsSurvivor, markDeath), fxSurvivor[:fxDeath]
	case !closed:
		if err := db.Close(); err != nil && !faultInjected(err) {
			t.Errorf("k=%d: close: %v", k, err)
		}
	}
	for _, w := range []struct {
		name string
		fs   vfs.FS
		evs  []workload.Event
		fx   []workload.Effect
	}{
		{"image at the fault", image, faultCut(rec.Events(), markFault), prov.Effects()[:fxFault]},
		{"survivor", survivor, evsSurvivor, fxSurvivor},
	} {
		if w.fs == nil {
			continue
		}
		clock.Advance(workload.TTL + time.Second)
		db2, err := pebblestore.Open("db", &pebblestore.Options{
			Options: receipts.Options{
				Retention:  workload.Retention,
				LeaseTTL:   workload.TTL,
				GCInterval: -1,
				Now:        clock.Now,
			},
			Pebble: &pebble.Options{FS: w.fs, Logger: &workload.TestLogger{}},
		})
		if err != nil {
			t.Fatalf("k=%d: %s: reopen: %v", k, w.name, err)
		}
		bad2 := &workload.Bad{}
		workload.Check(ctx, db2, w.evs, w.fx, bad2, k, true)
		if err := db2.Close(); err != nil {
			t.Errorf("k=%d: %s: close: %v", k, w.name, err)
		}
		if bad2.Count() > 0 {
			t.Errorf("k=%d: %s: %s", k, w.name, bad2)
		}
		if w.name == "survivor" {
			st.survivorChecks++
		} else {
			st.imageChecks++
		}
	}
	return true
}

// faultLogger is workload.TestLogger plus a hook that runs at Fatalf.
type faultLogger struct {
	workload.TestLogger
	onFatal func()
}

func (l *faultLogger) Fatalf(format string, args ...any) {
	if l.onFatal != nil {
		l.onFatal()
	}
	l.TestLogger.Fatalf(format, args...)
}

// faultCatch runs fn and reports whether it panicked with Fatalf's panic
// or with an injected error (Pebble panics outright when a directory sync
// fails, in atomicfs.Marker.Move: fsync errors are unrecoverable).
func faultCatch(fn func()) (fatal bool) {
	defer func() {
		if r := recover(); r != nil {
			_, isFatal := r.(workload.Fatal)
			err, isErr := r.(error)
			if !isFatal && !(isErr && faultInjected(err)) {
				panic(r)
			}
			fatal = true
		}
	}()
	fn()
	return false
}

// faultClose closes a DB whose Pebble hit Fatalf, ignoring what it says.
// DB.Close writes the store's clock (synced) before it closes Pebble; on a
// wedged Pebble that write hits Fatalf again and Close panics, after
// releasing Pebble and the directory lock.
func faultClose(db *receipts.DB) {
	faultCatch(func() { _ = db.Close() })
}

// TestFaultRandomReadErrors fills a store (receipts, failures, live claims,
// released keys, over several epochs), flushes it to sstables, reopens it
// with a tiny block cache and fails each read-class file operation with a
// seeded probability. A read error must surface as an error, never as "not
// found": Claim of a finished key never hands out a lease, Claim of a held
// key never hands out a second lease, Do never runs its function for a
// finished key, Lookup never says ErrNotFound for a stored key, and Scan
// either returns every stored record or an error.
func TestFaultRandomReadErrors(t *testing.T) {
	seed := testkit.Seed(t)
	rounds := faultReadRounds
	if testkit.Soak() {
		rounds = 200
	}
	var total faultReadStats
	for _, p := range []float64{0.02, 0.1, 0.3} {
		s := faultReadRun(t, seed, p, rounds)
		t.Logf("p=%.2f: %s", p, &s)
		total.add(s)
	}
	if total.injected == 0 || total.surfaced == 0 {
		t.Fatalf("no read error surfaced: %s", &total)
	}
	t.Logf("total: %s", &total)
}

type faultReadStats struct {
	calls, injected, surfaced, replays, claimsRefused, notFoundAbsent, scans, scansFailed int
}

func (s *faultReadStats) add(o faultReadStats) {
	s.calls += o.calls
	s.injected += o.injected
	s.surfaced += o.surfaced
	s.replays += o.replays
	s.claimsRefused += o.claimsRefused
	s.notFoundAbsent += o.notFoundAbsent
	s.scans += o.scans
	s.scansFailed += o.scansFailed
}

func (s *faultReadStats) String() string {
	return fmt.Sprintf("%d calls, %d read errors injected, %d surfaced as errors, %d correct replays, %d claims of held keys refused, %d absent keys reported absent, %d scans (%d ended in an error); second claims 0",
		s.calls, s.injected, s.surfaced, s.replays, s.claimsRefused, s.notFoundAbsent, s.scans, s.scansFailed)
}

func faultReadRun(t *testing.T, seed uint64, p float64, rounds int) faultReadStats {
	t.Helper()
	ctx := context.Background()
	mem := vfs.NewMem()
	clock := receiptstest.NewClock(workload.Start)
	var on atomic.Bool
	var injected atomic.Int64
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, uint64(p*1000)))
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !on.Load() || op.Kind.ReadOrWrite() != errorfs.OpIsRead {
			return nil
		}
		rngMu.Lock()
		fail := rng.Float64() < p
		rngMu.Unlock()
		if !fail {
			return nil
		}
		injected.Add(1)
		return errorfs.ErrInjected
	})
	cache := pebble.NewCache(1 << 10)
	defer cache.Unref()
	opts := &pebblestore.Options{
		Options: receipts.Options{
			Retention:  8 * time.Hour,
			LeaseTTL:   time.Hour,
			EpochWidth: time.Hour,
			GCInterval: -1,
			Now:        clock.Now,
		},
		Pebble: &pebble.Options{
			FS: errorfs.Wrap(mem, inj), Logger: &workload.TestLogger{}, Cache: cache,
			DisableTableStats: true, DisableAutomaticCompactions: true,
		},
	}
	db, err := pebblestore.Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}

	// Fill: 5 epochs of receipts and failures (some written again later,
	// moving epochs), released keys, and live claims.
	const perEpoch = 40
	type kind uint8
	const (
		absent kind = iota
		finished
		held
		unknown // an operation on it failed under faults
	)
	state := make(map[receipts.Key]kind)
	want := make(map[receipts.Key]*receipts.Receipt)
	fk := func(i int) receipts.Key {
		return receipts.Key{Scope: fmt.Sprintf("s%d", i%3), ID: fmt.Sprintf("k%04d", i)}
	}
	n := 0
	for epoch := range 5 {
		for range perEpoch {
			k := fk(n)
			n++
			l, _, err := db.Claim(ctx, k, workload.FP(k))
			if err != nil {
				t.Fatal(err)
			}
			var r *receipts.Receipt
			switch n % 5 {
			case 0:
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
				state[k] = absent
				continue
			case 1:
				r, err = l.Fail(ctx, []byte("no: "+k.ID))
			default:
				r, err = l.Commit(ctx, []byte("ok: "+k.ID))
			}
			if err != nil {
				t.Fatal(err)
			}
			state[k], want[k] = finished, r
		}
		clock.Advance(time.Hour)
		_ = epoch
	}
	for i := range 30 { // live claims, in the newest epoch
		k := fk(n + i)
		if _, _, err := db.Claim(ctx, k, workload.FP(k)); err != nil {
			t.Fatal(err)
		}
		state[k] = held
	}
	n += 30
	for i := range 30 { // never claimed
		state[fk(n+i)] = absent
	}
	n += 30
	if err := peek.Pebble(db).Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = pebblestore.Open("db", opts); err != nil {
		t.Fatal(err)
	}
	defer func() {
		on.Store(false)
		if err := db.Close(); err != nil && !faultInjected(err) {
			t.Errorf("close: %v", err)
		}
	}()

	var s faultReadStats
	errOK := func(what string, k receipts.Key, err error) bool {
		if err == nil {
			return false
		}
		if errors.Is(err, receipts.ErrNotFound) {
			t.Errorf("p=%.2f: %s %s: ErrNotFound for a stored key (read error taken for absence?)", p, what, k)
		} else if !faultInjected(err) {
			t.Errorf("p=%.2f: %s %s: unexpected error %v", p, what, k, err)
		}
		s.surfaced++
		return true
	}
	keys := make([]receipts.Key, 0, n)
	for i := range n {
		keys = append(keys, fk(i))
	}
	orng := rand.New(rand.NewPCG(seed, 0x0b5))
	on.Store(true)
	for round := range rounds {
		_ = round
		orng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for _, k := range keys[:60] {
			s.calls++
			switch state[k] {
			case finished:
				switch orng.IntN(3) {
				case 0:
					l, r, err := db.Claim(ctx, k, workload.FP(k))
					if errOK("claim", k, err) {
						continue
					}
					if l != nil {
						t.Fatalf("p=%.2f: claim of finished %s handed out a second lease (token %d)", p, k, l.Token())
					}
					faultSameReceipt(t, k, want[k], r)
					s.replays++
				case 1:
					r, err := db.Do(ctx, k, workload.FP(k), func(context.Context, *receipts.Lease) ([]byte, error) {
						t.Fatalf("p=%.2f: Do ran its function again for finished %s", p, k)
						return nil, nil
					})
					if r == nil && errOK("Do", k, err) {
						continue
					}
					faultSameReceipt(t, k, want[k], r)
					s.replays++
				default:
					r, err := db.Lookup(ctx, k)
					if errOK("lookup", k, err) {
						continue
					}
					faultSameReceipt(t, k, want[k], r)
					s.replays++
				}
			case held:
				if orng.IntN(2) == 0 {
					r, err := db.Lookup(ctx, k)
					if errOK("lookup", k, err) {
						continue
					}
					if r.State != receipts.Pending {
						t.Errorf("p=%.2f: lookup of held %s: %s", p, k, workload.FmtReceipt(r))
					}
					continue
				}
				l, r, err := db.Claim(ctx, k, workload.FP(k))
				if errors.Is(err, receipts.ErrInProgress) {
					s.claimsRefused++
					continue
				}
				if errOK("claim", k, err) {
					continue
				}
				t.Fatalf("p=%.2f: claim of held %s: lease %v, receipt %s (a second claim)", p, k, l != nil, workload.FmtReceipt(r))
			case absent:
				if orng.IntN(2) == 0 {
					_, err := db.Lookup(ctx, k)
					if errors.Is(err, receipts.ErrNotFound) {
						s.notFoundAbsent++
					} else if err == nil || !faultInjected(err) {
						t.Errorf("p=%.2f: lookup of absent %s: %v", p, k, err)
					} else {
						s.surfaced++
					}
					continue
				}
				l, r, err := db.Claim(ctx, k, workload.FP(k))
				switch {
				case err != nil && faultInjected(err):
					s.surfaced++
				case err != nil || r != nil:
					t.Errorf("p=%.2f: claim of absent %s: %s, %v", p, k, workload.FmtReceipt(r), err)
				default:
					s.notFoundAbsent++
					r, err := l.Commit(ctx, []byte("ok: "+k.ID))
					if err != nil {
						if !faultInjected(err) {
							t.Errorf("p=%.2f: commit %s: %v", p, k, err)
						}
						s.surfaced++
						state[k] = unknown
						continue
					}
					state[k], want[k] = finished, r
				}
			}
		}
		// A scan sees every stored record or says it failed.
		s.scans++
		seen := 0
		failed := false
		for r, err := range db.Scan(ctx, receipts.Filter{}) {
			if err != nil {
				if !faultInjected(err) {
					t.Errorf("p=%.2f: scan: %v", p, err)
				}
				failed = true
				continue
			}
			if w := want[r.Key]; w != nil {
				faultSameReceipt(t, r.Key, w, r)
			}
			if state[r.Key] != unknown {
				seen++
			}
		}
		if failed {
			s.scansFailed++
			s.surfaced++
			continue
		}
		stored := 0
		for _, st := range state {
			if st == finished || st == held {
				stored++
			}
		}
		if seen != stored {
			t.Errorf("p=%.2f: scan returned %d of %d stored records and no error", p, seen, stored)
		}
	}
	s.injected = int(injected.Load())
	return s
}

func faultSameReceipt(t *testing.T, k receipts.Key, want, got *receipts.Receipt) {
	t.Helper()
	if got == nil || want == nil || got.Key != k || got.State != want.State || got.Token != want.Token || string(got.Result) != string(want.Result) {
		t.Errorf("receipt of %s: got %s, want %s", k, workload.FmtReceipt(got), workload.FmtReceipt(want))
	}
}

// TestFaultWALSyncFailStop fails the sync of the WAL under a Claim. With a
// test logger, Pebble's Fatalf panics out of Claim: no lease is handed out.
// After a restart from the synced data the key is free (the claim was never
// acknowledged), and receipts committed before are all there.
func TestFaultWALSyncFailStop(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	clock := receiptstest.NewClock(workload.Start)
	var on atomic.Bool
	var image *vfs.MemFS
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		default:
			return nil
		}
		if !on.Load() || !strings.HasSuffix(op.Path, ".log") {
			return nil
		}
		on.Store(false)
		image = mem.CrashClone(vfs.CrashCloneCfg{})
		return errorfs.ErrInjected
	})
	logger := &workload.TestLogger{}
	db := workload.Open(t, errorfs.Wrap(mem, inj), clock, logger)
	before := make(map[receipts.Key]*receipts.Receipt)
	for i := range 20 {
		k := receipts.Key{Scope: "s", ID: fmt.Sprintf("done-%d", i)}
		r, err := db.Do(ctx, k, workload.FP(k), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte(k.ID), nil })
		if err != nil {
			t.Fatal(err)
		}
		before[k] = r
	}
	victim := receipts.Key{Scope: "s", ID: "victim"}
	on.Store(true)
	var lease *receipts.Lease
	fatal := faultCatch(func() { lease, _, _ = db.Claim(ctx, victim, workload.FP(victim)) })
	if !fatal || lease != nil || logger.Count() != 1 {
		t.Fatalf("WAL sync failure: fatal=%v lease=%v fatals=%d; want Fatalf and no lease", fatal, lease != nil, logger.Count())
	}
	faultClose(db)
	t.Logf("Pebble: %s", logger.Fatals[0])

	clock.Advance(workload.TTL + time.Second)
	db = workload.Open(t, image, clock, &workload.TestLogger{})
	defer db.Close()
	for k, want := range before {
		got, err := db.Lookup(ctx, k)
		if err != nil {
			t.Fatalf("lookup %s after restart: %v", k, err)
		}
		faultSameReceipt(t, k, want, got)
	}
	l, r, err := db.Claim(ctx, victim, workload.FP(victim))
	if err != nil || l == nil {
		t.Fatalf("claim of %s after restart: %s, %v", victim, workload.FmtReceipt(r), err)
	}
}

// TestFaultWALSyncDefaultExits shows the default (no Options.Pebble.Logger):
// a failed WAL sync ends the process with status 1 before the Claim returns.
// The child is this test binary, run again with RECEIPTS_FAULT_CHILD=1.
func TestFaultWALSyncDefaultExits(t *testing.T) {
	if os.Getenv("RECEIPTS_FAULT_CHILD") == "1" {
		faultWALSyncChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultWALSyncDefaultExits$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RECEIPTS_FAULT_CHILD=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || ee.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("child: %v, want exit status 1\n%s", err, out)
	}
	if strings.Contains(string(out), "CLAIM RETURNED") || !strings.Contains(string(out), "CLAIMING") {
		t.Fatalf("child output:\n%s", out)
	}
	if !strings.Contains(string(out), "pebble: fatal") {
		t.Fatalf("child did not log Pebble's fatal error:\n%s", out)
	}
}

func faultWALSyncChild() {
	ctx := context.Background()
	var on atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			if on.Load() && strings.HasSuffix(op.Path, ".log") {
				return errorfs.ErrInjected
			}
		}
		return nil
	})
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{
			GCInterval: -1,
		},
		Pebble: &pebble.Options{FS: errorfs.Wrap(vfs.NewMem(), inj)},
	})
	if err != nil {
		fmt.Println("OPEN FAILED", err)
		os.Exit(3)
	}
	on.Store(true)
	fmt.Println("CLAIMING")
	l, r, err := db.Claim(ctx, receipts.Key{Scope: "s", ID: "x"}, []byte("fp"))
	fmt.Println("CLAIM RETURNED", l != nil, r != nil, err)
	os.Exit(0)
}

// faultChildLogger is the Pebble logger of the Open-fault child. Fatalf in
// the goroutine that opened the store panics (faultCatch recovers it);
// Fatalf in one of Pebble's background goroutines (a flush) marks the
// process dead and parks that goroutine for good: the process would have
// exited there, and the child abandons that DB.
type faultChildLogger struct {
	workload.TestLogger
	gid  string
	once sync.Once
	dead chan struct{}
}

func faultGoroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

func newFaultChildLogger() *faultChildLogger {
	return &faultChildLogger{dead: make(chan struct{})}
}

func (l *faultChildLogger) Fatalf(format string, args ...any) {
	if faultGoroutineID() == l.gid {
		l.TestLogger.Fatalf(format, args...)
	}
	l.die()
}

// die ends the "process" in a background goroutine: parks it for good.
func (l *faultChildLogger) die() {
	l.once.Do(func() { close(l.dead) })
	select {}
}

// faultDirSync: op syncs a directory.
func faultDirSync(op errorfs.Op) bool {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		base := op.Path[strings.LastIndexByte(op.Path, '/')+1:]
		return base == "db" || base == "." || base == ""
	}
	return false
}

// TestFaultOpenAtK fails the k-th write-class file operation of Open, for
// every k until an Open completes, on a store left by a process crash (a
// WAL to replay). Pebble panics outright on some of these (a failed
// directory sync while moving its MANIFEST marker) and leaves goroutines
// behind, so the loop runs in a child process (this test binary again,
// with RECEIPTS_FAULT_OPEN_CHILD=1) that exits without the leak check.
// For each k the disk image at the fault is reopened and checked against
// everything acknowledged before the crash.
func TestFaultOpenAtK(t *testing.T) {
	if os.Getenv("RECEIPTS_FAULT_OPEN_CHILD") == "1" {
		faultOpenChild()
		return
	}
	seed := testkit.Seed(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultOpenAtK$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RECEIPTS_FAULT_OPEN_CHILD=1", fmt.Sprintf("RECEIPTS_SEED=%d", seed))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	i := strings.Index(string(out), "OPENFAULT ")
	if i < 0 {
		t.Fatalf("child said:\n%s", out)
	}
	t.Log(strings.TrimSpace(string(out[i:])))
}

func faultOpenChild() {
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	fmt.Sscan(os.Getenv("RECEIPTS_SEED"), &seed)
	die := func(format string, args ...any) {
		fmt.Printf("FAIL: "+format+"\n", args...)
		os.Exit(1)
	}
	open := func(fs vfs.FS, clock *receiptstest.Clock, logger pebble.Logger) (*receipts.DB, error) {
		return pebblestore.Open("db", &pebblestore.Options{
			Options: receipts.Options{
				Retention:  workload.Retention,
				LeaseTTL:   workload.TTL,
				GCInterval: -1,
				Now:        clock.Now,
			},
			Pebble: &pebble.Options{FS: fs, Logger: logger},
		})
	}

	// A store with history, left by a process crash.
	base := vfs.NewCrashableMem()
	clock := receiptstest.NewClock(workload.Start)
	rec := &workload.Recorder{}
	prov := workload.NewProvider()
	bad := &workload.Bad{}
	db, err := open(base, clock, &workload.TestLogger{})
	if err != nil {
		die("open: %v", err)
	}
	load := &workload.Load{DB: db, Clock: clock, Prov: prov, Rec: rec, Bad: bad, St: &workload.LoadStats{}, Window: 8, MaxJumps: 2, DoWait: time.Millisecond}
	load.Worker(0, rand.New(rand.NewPCG(seed, 0x09e)), 300)
	if bad.Count() > 0 {
		die("workload: %s", bad)
	}
	crashed := base.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(seed, 1))})
	_ = db.Close()
	evs, fx := rec.Events(), prov.Effects()

	imgRNG := rand.New(rand.NewPCG(seed, 2))
	var opened, failed, panicked, checked int
	k := 0
	for ; ; k++ {
		fs := crashed.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: imgRNG})
		// The injector runs on Pebble's goroutines, which may outlive this iteration (a
		// failed open leaves its cleanup goroutine running): it reads this iteration's k,
		// not the loop variable the next iteration increments.
		k := k
		var writes atomic.Int64
		var image *vfs.MemFS
		logger := newFaultChildLogger()
		inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
			if op.Kind.ReadOrWrite() != errorfs.OpIsWrite || writes.Add(1)-1 != int64(k) {
				return nil
			}
			// Even k: power loss (synced data only); odd k: process
			// death (all written data). Not a random share of the unsynced
			// directory entries: Pebble creates a MANIFEST and its marker
			// and syncs the directory once for both (atomicfs.Marker.Move),
			// so an image that keeps the marker's entry but drops the
			// MANIFEST's cannot be opened ("could not open manifest file").
			// Ordered-metadata file systems do not do that; CrashClone's
			// independent choice per entry does.
			cfg := vfs.CrashCloneCfg{}
			if k%2 == 1 {
				cfg.UnsyncedDataPercent = 100
				cfg.RNG = imgRNG
			}
			image = fs.CrashClone(cfg)
			if faultDirSync(op) && faultGoroutineID() != logger.gid {
				// Pebble panics on a failed directory sync; in one of its
				// background goroutines that ends the process. Die here.
				logger.die()
			}
			return errorfs.ErrInjected
		})
		clock.Advance(workload.TTL + time.Second)
		var db *receipts.DB
		var err error
		var fatal, died bool
		opened1 := make(chan struct{})
		go func() {
			defer close(opened1)
			logger.gid = faultGoroutineID()
			fatal = faultCatch(func() { db, err = open(errorfs.Wrap(fs, inj), clock, logger) })
		}()
		select {
		case <-opened1:
		case <-logger.dead: // Open waits for the flush that died
			died = true
		}
		switch {
		case died:
			panicked++
		case fatal:
			panicked++
		case err != nil:
			if !faultInjected(err) {
				die("k=%d: open: %v", k, err)
			}
			failed++
		default:
			// Pebble may hit the fault later, in the flush of the replayed
			// WAL; the process would then be gone (see faultChildLogger).
			bad := &workload.Bad{}
			done := make(chan bool, 1)
			go func() {
				done <- faultCatch(func() {
					workload.Check(ctx, db, evs, fx, bad, k, true)
					_ = db.Close()
				})
			}()
			select {
			case <-logger.dead:
				panicked++
			case f := <-done:
				if f {
					panicked++
				} else {
					opened++
				}
				if bad.Count() > 0 && image == nil {
					die("k=%d: opened despite the fault: %s", k, bad)
				}
			}
		}
		if image == nil {
			if died || fatal || err != nil {
				die("k=%d: open failed without a fault: %v", k, err)
			}
			break
		}
		db2, err := open(image, clock, &workload.TestLogger{})
		if err != nil {
			die("k=%d: reopen after the fault: %v", k, err)
		}
		bad := &workload.Bad{}
		workload.Check(ctx, db2, evs, fx, bad, k, true)
		if err := db2.Close(); err != nil {
			die("k=%d: close: %v", k, err)
		}
		if bad.Count() > 0 {
			die("k=%d: image at the fault: %s", k, bad)
		}
		checked++
	}
	fmt.Printf("OPENFAULT k = 0..%d over a crashed store with %d acknowledged events and %d effects: %d opens panicked (Fatalf or a raw panic), %d returned the error, %d succeeded despite the fault; %d disk images at the fault reopened and checked, 0 violations\n",
		k, len(evs), len(fx), panicked, failed, opened-1, checked)
	os.Exit(0)
}

// faultReturningLogger is a Pebble logger whose Fatalf returns (logs and
// carries on), as an application's own logger might.
type faultReturningLogger struct{ fatals atomic.Int32 }

func (l *faultReturningLogger) Infof(string, ...any)  {}
func (l *faultReturningLogger) Errorf(string, ...any) {}
func (l *faultReturningLogger) Fatalf(string, ...any) { l.fatals.Add(1) }

// TestFaultReturningFatalfIsFailStop: Pebble reports a failed WAL sync only
// through Logger.Fatalf; if that returns, Pebble's Apply returns nil as if
// the batch were durable. With an application logger whose Fatalf returns,
// the store must still not hand out a lease (nor a receipt) that a power
// loss takes away.
func TestFaultReturningFatalfIsFailStop(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	clock := receiptstest.NewClock(workload.Start)
	var on atomic.Bool
	var image *vfs.MemFS
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			if on.Load() && strings.HasSuffix(op.Path, ".log") {
				on.Store(false)
				image = mem.CrashClone(vfs.CrashCloneCfg{})
				return errorfs.ErrInjected
			}
		}
		return nil
	})
	logger := &faultReturningLogger{}
	db := workload.Open(t, errorfs.Wrap(mem, inj), clock, logger)
	k := receipts.Key{Scope: "s", ID: "x"}
	on.Store(true)
	var lease *receipts.Lease
	var err error
	faultCatchAny(func() { lease, _, err = db.Claim(ctx, k, workload.FP(k)) })
	faultCatchAny(func() { _ = db.Close() }) // releases Pebble even if it panics
	if logger.fatals.Load() == 0 {
		t.Fatal("the injected WAL sync failure never reached Fatalf")
	}
	if lease != nil {
		// Show what that costs: the claim is gone after a power loss.
		db2 := workload.Open(t, image, clock, &workload.TestLogger{})
		_, lerr := db2.Lookup(ctx, k)
		_ = db2.Close()
		t.Fatalf("Claim handed out a lease (token %d, err %v) after its WAL sync failed; after a power loss Lookup says %v", lease.Token(), err, lerr)
	}
}

// faultCatchAny runs fn and reports whether it panicked (with anything).
func faultCatchAny(fn func()) (panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	fn()
	return false
}
