// Package stepwatch is what the steps of a front end's attempt (receipthttp's and
// receiptmcp's Attempt.Step) tell its middleware: the first step whose outcome became
// unknown, or that did not match the key's journal. Either ends the attempt's steps, and the
// middleware then answers for them, whatever the handler wrote.
package stepwatch

import (
	"errors"
	"fmt"
	"sync"
)

// Watch records what an attempt's steps said. It is safe for concurrent use.
type Watch struct {
	// The errors a step's error is read by (receipts.ErrStepMismatch and
	// receipts.ErrOutcomeUnknown: this package is below the root and does not import it).
	mismatchErr, unknownErr error

	mu       sync.Mutex
	unknown  string // the step whose outcome is unknown
	mismatch string // the step that did not match the key's journal
}

// New returns a Watch that reads a step's error by mismatch (the key's journal holds another
// step: receipts.ErrStepMismatch) and unknown (receipts.ErrOutcomeUnknown).
func New(mismatch, unknown error) *Watch { return &Watch{mismatchErr: mismatch, unknownErr: unknown} }

// Note records what Step's error says about step name.
func (w *Watch) Note(name string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.unknown != "" || w.mismatch != "" {
		return // the first one ended the attempt's steps; later steps report it again
	}
	switch {
	case errors.Is(err, w.mismatchErr):
		w.mismatch = name
	case errors.Is(err, w.unknownErr):
		w.unknown = name
	}
}

// Failed returns the step that ended the attempt's steps ("" for none), and whether it did
// not match the journal (else its outcome is unknown).
func (w *Watch) Failed() (name string, mismatch bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mismatch != "" {
		return w.mismatch, true
	}
	return w.unknown, false
}

// Err is the error that abandons the claim of an attempt whose steps ended with a step that
// failed (nil if none did), its message prefixed with pkg: the response is not the action's
// outcome.
func (w *Watch) Err(pkg string) error {
	name, mismatch := w.Failed()
	switch {
	case name == "":
		return nil
	case mismatch:
		return fmt.Errorf("%s: step %q: %w", pkg, name, w.mismatchErr)
	}
	return fmt.Errorf("%s: step %q: %w", pkg, name, w.unknownErr)
}
