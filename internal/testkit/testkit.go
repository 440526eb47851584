// Package testkit holds the helpers the long test harnesses share (the
// harnesses under tests and the root package's tests): the soak
// switch, integer knobs and seeds from the environment, the race-detector
// flag, and a driver that runs a rapid property for a number of checks.
//
// The fake clock is receiptstest.Clock; stores are opened by each test with
// receipts.Open on a Pebble vfs.
package testkit

import (
	"flag"
	"os"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Soak reports whether the long versions of the harnesses should run
// (RECEIPTS_SOAK=1, as scripts/soak.sh sets it).
func Soak() bool { return os.Getenv("RECEIPTS_SOAK") == "1" }

// EnvInt reads an integer knob from the environment: def if name is unset
// or not an integer.
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// Seed is a run's seed: RECEIPTS_SEED, or the time. It logs it, with the
// way to rerun.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("RECEIPTS_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (rerun with RECEIPTS_SEED=%d)", seed, seed)
	return seed
}

// RunRapid runs prop for at least target checks: rapid.Check runs
// -rapid.checks (default 100) per call, so it is called as often as needed.
// With -rapid.seed or -rapid.failfile (reproducing a failure) it runs once.
func RunRapid(t *testing.T, target int, prop func(*rapid.T)) {
	t.Helper()
	per := 100
	if f := flag.Lookup("rapid.checks"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n > 0 {
			per = n
		}
	}
	rounds := (target + per - 1) / per
	for _, name := range []string{"rapid.seed", "rapid.failfile"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != f.DefValue {
			rounds = 1
		}
	}
	start := time.Now()
	for i := 0; i < rounds && !t.Failed(); i++ {
		rapid.Check(t, prop)
	}
	t.Logf("%d rounds of %d checks in %s", rounds, per, time.Since(start).Round(time.Millisecond))
}
