//go:build race

package hostkill_test

// hostKillCycles is the number of host processes per variant under -race.
const hostKillCycles = 8
