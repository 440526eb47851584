//go:build unix

package pgcluster

import (
	"errors"
	"syscall"
)

// processAlive reports whether a process with this ID exists (signal 0: no signal is sent;
// EPERM means it exists but is another user's).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
