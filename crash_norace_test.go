//go:build !race

package receipts_test

// Sizes of the crash harnesses in CI (go test without -race). RECEIPTS_SOAK=1
// and the RECEIPTS_CRASHES / RECEIPTS_KILLS knobs run longer versions.
const (
	crashPowerLossCrashes = 100 // power-loss crashes per mode (p0, prand)
	crashKillCycles       = 100 // SIGKILL cycles of the child process
	crashRaceScaled       = false
)
