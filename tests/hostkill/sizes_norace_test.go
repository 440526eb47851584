//go:build !race

package hostkill_test

// hostKillCycles is the number of host processes per variant in CI.
const hostKillCycles = 25

// sharedRounds is TestHostKillSharedJournal's number of rounds.
const sharedRounds = 4

// stepsKillActionsCI is TestStepsKill's number of actions per variant.
const stepsKillActionsCI = 24
