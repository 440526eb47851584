package reconcile

import (
	"context"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/private"
)

// The typed side of the root's hooks in internal/private, through which a
// Reconciler works inside the protocol (the root sets them in its init).

// enter registers an in-flight call on db, so that db's Close waits for it,
// and returns the channel Close closes as it begins; exit ends the call.
func enter(db *receipts.DB) (closing <-chan struct{}, err error) { return private.Enter(db) }

func exit(db *receipts.DB) { private.Exit(db) }

// background runs run in a goroutine db's Close waits for; call it between
// enter and exit.
func background(db *receipts.DB, run func()) { private.Background(db, run) }

// checkLeaseFor checks d as a LeaseFor of db's claims (ErrInvalidOptions).
func checkLeaseFor(db *receipts.DB, d time.Duration) error { return private.CheckLeaseFor(db, d) }

// takeOver takes the listed claim r over, inside the caller's enter, with
// leases of leaseFor (zero: Options.LeaseTTL).
func takeOver(ctx context.Context, db *receipts.DB, r *receipts.Receipt, leaseFor time.Duration) (*receipts.Lease, error) {
	l, err := private.TakeOver(ctx, db, r, leaseFor)
	if err != nil {
		return nil, err
	}
	return l.(*receipts.Lease), nil
}

// concluded is what conclude recorded.
type concluded struct {
	verdict int               // a private.Verdict constant
	receipt *receipts.Receipt // VerdictCommit and VerdictFail, once recorded
	unknown error             // VerdictUnknown: why a result could not be recorded (ErrOutcomeUnknown), or nil
	err     error             // the failure to record the verdict
}

// conclude records what Check's result and error say about l's attempt:
// the contract's outcome protocol, with NotPerformed forgetting the claim.
func conclude(ctx context.Context, l *receipts.Lease, result []byte, cerr error) concluded {
	v, r, unknown, err := private.Conclude(ctx, l, result, cerr)
	o := concluded{verdict: v, unknown: unknown, err: err}
	o.receipt, _ = r.(*receipts.Receipt)
	return o
}

// keepAlive renews l in the background, not gated (the caller holds the
// gate), until the returned stop is called.
func keepAlive(l *receipts.Lease, cancel context.CancelCauseFunc) (stop func()) {
	return private.KeepAlive(l, cancel)
}
