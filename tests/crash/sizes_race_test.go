//go:build race

package crash_test

// Under -race the harness runs smaller (the race detector slows it down
// about tenfold); the full CI size runs without -race.
const crashPowerLossCrashes = 25
