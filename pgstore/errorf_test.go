package pgstore

import (
	"errors"
	"testing"

	"github.com/receiptstore/receipts/driver"
)

// errorf's messages say "pgstore: " once and each layer's word once, however the layers
// nest, and keep every wrapped error visible to errors.Is and errors.As.
func TestErrorfLayersOnce(t *testing.T) {
	lost := &sentErr{err: errors.New("read tcp: use of closed network connection"), pid: 7}
	inner := errorf("pgstore: claim: %w", errorf("%w: canceling wait (SQLSTATE 01000)", ErrNotReplicated))
	for _, c := range []struct {
		err  error
		want string
	}{
		{errorf("pgstore: claim: %w", inner), "pgstore: claim: commit not confirmed by a synchronous standby: canceling wait (SQLSTATE 01000)"},
		{errorf("pgstore: claim %s: %w", "k", inner), "pgstore: claim k: commit not confirmed by a synchronous standby: canceling wait (SQLSTATE 01000)"},
		{errorf("pgstore: dotx: outcome unknown: %w", errorf("pgstore: dotx: commit: %w", lost)), "pgstore: dotx: outcome unknown: commit: read tcp: use of closed network connection"},
		{errorf("%w: %w", ErrNoSyncStandby, errorf("%w, and more", ErrPoolNotConfigured)), "pgstore: no synchronous standby: the pool was not built with pgstore.Configure, and more"},
		{errorf("pgstore: finish: %w", driver.ErrLeaseLost), "pgstore: finish: " + driver.ErrLeaseLost.Error()},
		{errorf("pgstore: claim: its reply was lost; it landed, but %w", errorf("confirming: %w", ErrNotReplicated)), "pgstore: claim: its reply was lost; it landed, but confirming: commit not confirmed by a synchronous standby"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
	err := errorf("pgstore: dotx: %w (%w)", errorf("pgstore: dotx: commit: %w", lost), inner)
	var s *sentErr
	if !errors.Is(err, ErrNotReplicated) || !errors.As(err, &s) || s.pid != 7 {
		t.Errorf("%v: the wrapped errors are not all visible (Is ErrNotReplicated, As *sentErr)", err)
	}
}
