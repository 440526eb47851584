//go:build race

package kill_test

// Under -race the harness runs smaller (the race detector slows it down
// about tenfold); the full CI size runs without -race.
const crashKillCycles = 20
