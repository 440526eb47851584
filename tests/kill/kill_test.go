package kill_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/receiptstore/receipts/tests/internal/workload"
)

// The process-crash harness. The parent (TestKillProcess) starts this test
// binary again as a child (TestKillProcessChild, switched on by
// RECEIPTS_KILL_CHILD) that opens the store on disk and runs the 8-way
// workload of tests/internal/workload. Effects go to provider.log, appended and
// fsynced before the holder commits; acknowledged calls go to events.log.
// The parent SIGKILLs the child at a random moment, starts it again, and
// so on. Each child first checks the store it finds against both logs; the
// parent checks once more at the end. Any violation fails the test.
//
// Clock: every child runs a fake clock that starts one hour after the
// previous child's start, so a restarted child finds the dead child's
// leases run out without anyone waiting for them.

const (
	crashKillEnvDir  = "RECEIPTS_KILL_CHILD" // the state directory; set only in the child
	crashKillEnvGen  = "RECEIPTS_KILL_GEN"
	crashKillEnvSeed = "RECEIPTS_KILL_SEED"
)

// TestKillProcess: at least 100 SIGKILL cycles in CI (fewer under -race);
// RECEIPTS_KILLS=n or RECEIPTS_SOAK=1 (2000) for more.
func TestKillProcess(t *testing.T) {
	if os.Getenv(crashKillEnvDir) != "" {
		t.Skip("in the child")
	}
	cycles := testkit.EnvInt("RECEIPTS_KILLS", crashKillCycles)
	if testkit.Soak() {
		cycles = testkit.EnvInt("RECEIPTS_KILLS", 2000)
	}
	seed := testkit.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0xdead))
	dir := t.TempDir()

	var killed, exited, notReady int
	var ackedEvents int
	start := time.Now()
	for gen := 0; gen < cycles; gen++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillProcessChild$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			crashKillEnvDir+"="+dir,
			crashKillEnvGen+"="+strconv.Itoa(gen),
			crashKillEnvSeed+"="+strconv.FormatUint(rng.Uint64(), 10),
		)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Wait until the child has checked the store and started its load.
		ready := make(chan bool, 1)
		var tail strings.Builder
		var tailMu sync.Mutex
		go func() {
			sc := bufio.NewScanner(out)
			ok := false
			for sc.Scan() {
				if sc.Text() == "KILLCHILD READY" && !ok {
					ok = true
					ready <- true
				}
				tailMu.Lock()
				if tail.Len() < 64<<10 {
					tail.WriteString(sc.Text() + "\n")
				}
				tailMu.Unlock()
			}
			if !ok {
				ready <- false
			}
		}()
		if <-ready {
			// Let the load run for a random while, then pull the plug.
			time.Sleep(time.Duration(2+rng.IntN(40)) * time.Millisecond)
			if err := cmd.Process.Signal(syscall.SIGKILL); err == nil {
				killed++
			}
		} else {
			notReady++
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee) && ee.ProcessState.Sys().(syscall.WaitStatus).Signaled():
		case err == nil:
			exited++ // ran out of its op budget first
		default:
			tailMu.Lock()
			t.Fatalf("gen %d: child failed: %v\nstdout:\n%s\nstderr:\n%s", gen, err, tail.String(), stderr.String())
		}
		if v, _ := os.ReadFile(filepath.Join(dir, "violations.log")); len(v) > 0 {
			t.Fatalf("gen %d: violations (seed %d):\n%s", gen, seed, v)
		}
	}

	// Final check, in this process.
	evs, effects, err := crashKillLoad(dir)
	if err != nil {
		t.Fatal(err)
	}
	ackedEvents = len(evs)
	clock := receiptstest.NewClock(workload.Start.Add(time.Duration(cycles+1) * time.Hour))
	db, err := pebblestore.Open(filepath.Join(dir, "db"), &pebblestore.Options{
		Options: receipts.Options{
			Retention:  workload.Retention,
			LeaseTTL:   workload.TTL,
			GCInterval: -1,
			Now:        clock.Now,
		},
		Pebble: &pebble.Options{FS: vfs.Default, Logger: &workload.TestLogger{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	bad := &workload.Bad{}
	cs := workload.Check(context.Background(), db, evs, effects, bad, cycles, true)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if bad.Count() > 0 {
		t.Fatalf("final check (seed %d): %s", seed, bad)
	}
	var commits, grants, takeovers int
	for _, e := range evs {
		switch e.Kind {
		case workload.EvCommitted:
			commits++
		case workload.EvGrant, workload.EvGrantBatch:
			grants++
			if e.State == receipts.Pending { // a takeover
				takeovers++
			}
		}
	}
	if commits == 0 || len(effects) == 0 || killed < cycles/2 {
		t.Fatalf("workload too thin: %d commits, %d effects, %d of %d cycles killed", commits, len(effects), killed, cycles)
	}
	t.Logf("%d cycles in %s: %d SIGKILLed, %d exited on their own, %d killed before ready; %d acknowledged events (%d claims, %d takeovers, %d commits), %d provider effects; final check: %d records, duplicate effects %d, lost acknowledged receipts %d, lost claims %d",
		cycles, time.Since(start).Round(time.Millisecond), killed, exited, notReady, ackedEvents, grants, takeovers, commits, len(effects), cs.Records, cs.Duplicates, cs.LostAcks, cs.LostClaims)
}

// crashKillLoad reads the two logs.
func crashKillLoad(dir string) ([]workload.Event, []workload.Effect, error) {
	evLines, err := workload.ReadLines(filepath.Join(dir, "events.log"))
	if err != nil {
		return nil, nil, err
	}
	fxLines, err := workload.ReadLines(filepath.Join(dir, "provider.log"))
	if err != nil {
		return nil, nil, err
	}
	evs := make([]workload.Event, 0, len(evLines))
	for _, l := range evLines {
		e, err := workload.ParseEvent(l)
		if err != nil {
			return nil, nil, err
		}
		evs = append(evs, e)
	}
	fx := make([]workload.Effect, 0, len(fxLines))
	for _, l := range fxLines {
		e, err := workload.ParseEffect(l)
		if err != nil {
			return nil, nil, err
		}
		fx = append(fx, e)
	}
	return evs, fx, nil
}

// TestKillProcessChild is the child side of TestKillProcess; it runs only
// when RECEIPTS_KILL_CHILD is set.
func TestKillProcessChild(t *testing.T) {
	dir := os.Getenv(crashKillEnvDir)
	if dir == "" {
		t.Skip("only as the child of TestKillProcess")
	}
	gen, _ := strconv.Atoi(os.Getenv(crashKillEnvGen))
	seed, _ := strconv.ParseUint(os.Getenv(crashKillEnvSeed), 10, 64)
	vf, err := os.OpenFile(filepath.Join(dir, "violations.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer vf.Close()
	bad := &workload.Bad{OnAdd: func(msg string) { _, _ = vf.WriteString(msg + "\n") }}

	evs, effects, err := crashKillLoad(dir) // also trims a torn last line
	if err != nil {
		t.Fatal(err)
	}
	rec := &workload.Recorder{Evs: evs}
	prov := workload.NewProvider()
	for _, e := range effects {
		prov.Load(e)
	}
	if rec.F, err = os.OpenFile(filepath.Join(dir, "events.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err != nil {
		t.Fatal(err)
	}
	defer rec.F.Close()
	if prov.F, err = os.OpenFile(filepath.Join(dir, "provider.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err != nil {
		t.Fatal(err)
	}
	defer prov.F.Close()

	clock := receiptstest.NewClock(workload.Start.Add(time.Duration(gen) * time.Hour))
	db, err := pebblestore.Open(filepath.Join(dir, "db"), &pebblestore.Options{
		Options: receipts.Options{
			Retention:  workload.Retention,
			LeaseTTL:   workload.TTL,
			GCInterval: -1,
			Now:        clock.Now,
		},
		Pebble: &pebble.Options{FS: vfs.Default, Logger: &workload.TestLogger{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	workload.Check(ctx, db, evs, effects, bad, gen, false)
	if bad.Count() > 0 {
		t.Fatalf("check at start of gen %d: %s", gen, bad)
	}

	// Start the key window where the previous child was killed, so that
	// its abandoned claims are taken over (and reconciled) here.
	var base int64
	for _, e := range evs {
		if e.Kind == workload.EvGrant || e.Kind == workload.EvGrantBatch {
			base = max(base, workload.KeyIndex(e.Key)-6)
		}
	}
	st := &workload.LoadStats{}
	load := &workload.Load{
		DB: db, Clock: clock, Gen: gen, Prov: prov, Rec: rec, Bad: bad, St: st,
		Window: 12, Base: base, MaxJumps: 20, DoWait: 3 * time.Millisecond,
	}
	fmt.Println("KILLCHILD READY")
	var wg sync.WaitGroup
	for w := range 8 {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() { load.Worker(w, wrng, 1500) })
	}
	wg.Wait()
	if rec.Err != nil {
		t.Fatal(rec.Err)
	}
	if bad.Count() > 0 {
		t.Fatalf("gen %d: %s", gen, bad)
	}
}
