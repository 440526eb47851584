//go:build !race

package testkit

// RaceEnabled is true under the race detector, which slows Pebble's write
// path about tenfold: the harnesses scale down with it.
const RaceEnabled = false
