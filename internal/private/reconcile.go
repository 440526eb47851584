package private

import (
	"context"
	"time"
)

// The hooks below are set by the root (package receipts) in its init and
// called by package reconcile, whose Reconciler works inside the root's
// protocol: db is a *receipts.DB, r a *receipts.Receipt and l a
// *receipts.Lease. Package reconcile wraps each in a typed helper.

// Enter registers an in-flight call on db, as the DB's own methods do, so
// that db's Close waits for it; it returns ErrClosed once Close has begun.
// It also returns the channel that Close closes as it begins: calls that
// wait give up on it. Each Enter that returns no error is ended by one Exit.
var Enter func(db any) (closing <-chan struct{}, err error)

// Exit ends an in-flight call registered by Enter.
var Exit func(db any)

// Background runs run in a goroutine of its own that db's Close waits for
// (after every in-flight call has ended), as it waits for the GC loop. Call
// it between Enter and Exit, so that Close cannot have begun waiting.
var Background func(db any, run func())

// CheckLeaseFor checks d as a LeaseFor for db's claims: ErrInvalidOptions
// unless it is positive and less than Options.Retention.
var CheckLeaseFor func(db any, d time.Duration) error

// TakeOver takes over the abandoned claim r, as DB.TakeOver does but inside
// the caller's Enter and without logging or tracing the takeover, with
// leases of leaseFor (zero: Options.LeaseTTL). It returns the lease.
var TakeOver func(ctx context.Context, db, r any, leaseFor time.Duration) (l any, err error)

// Verdicts that Conclude reports: what the contract made of the result and
// error it was given.
const (
	VerdictCommit  = iota + 1 // nil: a Succeeded receipt
	VerdictFail               // Permanent: a Failed receipt
	VerdictRelease            // NotPerformed: the claim is forgotten, the key is free
	VerdictUnknown            // anything else, or a result that cannot be recorded: abandoned
)

// Conclude records what result and ferr say about l's attempt, on ctx, by
// the contract's outcome protocol (Lease.conclude in run.go), with
// NotPerformed forgetting the claim (Lease.Forget) instead of releasing it.
// It returns the verdict (a Verdict constant), the receipt recorded
// (VerdictCommit, VerdictFail), for a result that could not be recorded the
// ErrOutcomeUnknown error that says why (unknown; nil otherwise), and err,
// the failure to record the verdict.
var Conclude func(ctx context.Context, l any, result []byte, ferr error) (verdict int, receipt any, unknown, err error)

// KeepAlive renews l in the background, every third of its TTL, until stop
// is called (stop waits for a renewal under way), as Lease.KeepAlive does
// but without Close's in-flight gate, so it goes on renewing while Close
// waits for the caller (which holds the gate). If the lease is lost or the
// store closed, it calls cancel with that error and stops.
var KeepAlive func(l any, cancel context.CancelCauseFunc) (stop func())
