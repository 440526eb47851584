//go:build !race

package pgnodes

const raceEnabled = false
