//go:build race

package hostkill_test

// hostKillCycles is the number of host processes per variant under -race.
const hostKillCycles = 8

// sharedRounds is TestHostKillSharedJournal's number of rounds.
const sharedRounds = 2

// stepsKillActionsCI is TestStepsKill's number of actions per variant.
const stepsKillActionsCI = 8
