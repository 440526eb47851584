//go:build race

package receipts_test

// raceEnabled scales the property and linearizability harnesses down under
// the race detector, which slows Pebble's write path about tenfold.
const raceEnabled = true
