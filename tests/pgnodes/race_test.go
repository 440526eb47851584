//go:build race

package pgnodes

// raceEnabled: under the race detector (CI's second pass over ./internal/...) the harnesses
// run at a smaller size; the full CI size runs in the pass without it.
const raceEnabled = true
