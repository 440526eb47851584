//go:build !race

package crash_test

// crashPowerLossCrashes is the number of power-loss crashes per mode (p0,
// prand) in CI (go test without -race). RECEIPTS_SOAK=1 runs 2,000, and
// RECEIPTS_CRASHES=n runs n.
const crashPowerLossCrashes = 60
