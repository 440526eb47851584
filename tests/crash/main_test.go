package crash_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine running: Close
// must stop everything the store started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
