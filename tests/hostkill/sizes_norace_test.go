//go:build !race

package hostkill_test

// hostKillCycles is the number of host processes per variant in CI.
const hostKillCycles = 25
