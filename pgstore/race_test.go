//go:build race

package pgstore

// raceEnabled scales SQL-bound property tests down under the race detector, which finds
// nothing more in them (their time is the server's) but slows the client.
const raceEnabled = true
