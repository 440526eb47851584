package receipts

import (
	"fmt"
	"strconv"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// State is a record's state.
type State uint8

// Record states. The zero State means "unspecified" (any, in a Filter).
const (
	// Pending: claimed; a lease is live, or has run out (abandoned).
	Pending State = State(driver.Pending)
	// Succeeded: committed with a result; replayed to every retry.
	Succeeded State = State(driver.Succeeded)
	// Failed: a definitive failure, replayed like a success.
	Failed State = State(driver.Failed)
)

// String returns "pending", "succeeded" or "failed".
func (s State) String() string {
	switch s {
	case Pending:
		return "pending"
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case 0:
		return "any"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// ParseState parses the String form of a State ("" and "any" give 0).
func ParseState(s string) (State, error) {
	switch s {
	case "pending":
		return Pending, nil
	case "succeeded":
		return Succeeded, nil
	case "failed":
		return Failed, nil
	case "", "any":
		return 0, nil
	}
	return 0, fmt.Errorf("%w: unknown state %q (want pending, succeeded or failed)", ErrInvalidArgument, s)
}

// Receipt is the stored record of an operation.
type Receipt struct {
	Key         Key
	Fingerprint []byte
	State       State // Pending, Succeeded or Failed
	// Result is what the operation returned (Succeeded) or its failure
	// (Failed); nil while Pending.
	Result []byte
	// Attempts is 1, plus one per takeover of an abandoned claim.
	Attempts uint32
	// Token is the fencing token of the last lease.
	Token     uint64
	CreatedAt time.Time
	// UpdatedAt is the last write; the record is visible until ExpiresAt =
	// UpdatedAt + Retention.
	UpdatedAt time.Time
	ExpiresAt time.Time
	// LeaseExpiresAt is when the lease runs out (Pending only; zero
	// otherwise). A lease is live while now < LeaseExpiresAt.
	LeaseExpiresAt time.Time
}

// Abandoned reports whether r is a Pending claim whose lease had run out at
// now: its outcome is unknown and must be reconciled.
func (r *Receipt) Abandoned(now time.Time) bool {
	return r.State == Pending && !now.Before(r.LeaseExpiresAt)
}

// newReceiptCopy is newReceipt with copies of r's fingerprint and result,
// which the engine keeps (driver.ClaimResult.Shared): the receipt and the
// copies are one allocation when they are small (up to 280 bytes), so that
// a replay answered from the engine's memory allocates once. The room
// beside the receipt comes in four sizes, each filling a size class of Go's
// allocator on 64-bit platforms (a 200-byte Receipt: 288, 352, 384 and 480
// bytes), so that a replay allocates no more than it needs: a 32-byte
// fingerprint and a 128-byte result took 480 bytes, and take 384.
func newReceiptCopy(r *driver.Record) *Receipt {
	n := len(r.Fingerprint) + len(r.Result)
	rc, buf := newReceiptRoom(n)
	*rc = receiptFields(r)
	nf := copy(buf, r.Fingerprint)
	rc.Fingerprint = buf[:nf:nf]
	if r.Result != nil {
		copy(buf[nf:], r.Result)
		rc.Result = buf[nf:n:n]
	}
	return rc
}

// newReceiptRoom returns a zero receipt and n bytes of room beside it (not
// nil, capacity n), in one allocation when n is small (newReceiptCopy).
func newReceiptRoom(n int) (rc *Receipt, buf []byte) {
	switch {
	case n <= len(receiptWith88{}.b):
		x := new(receiptWith88)
		rc, buf = &x.Receipt, x.b[:n:n]
	case n <= len(receiptWith152{}.b):
		x := new(receiptWith152)
		rc, buf = &x.Receipt, x.b[:n:n]
	case n <= len(receiptWith184{}.b):
		x := new(receiptWith184)
		rc, buf = &x.Receipt, x.b[:n:n]
	case n <= len(receiptWith280{}.b):
		x := new(receiptWith280)
		rc, buf = &x.Receipt, x.b[:n:n]
	default:
		rc, buf = new(Receipt), make([]byte, n)
	}
	return rc, buf
}

// A receipt with room for its fingerprint and result (newReceiptCopy).
type (
	receiptWith88 struct {
		Receipt
		b [88]byte
	}
	receiptWith152 struct {
		Receipt
		b [152]byte
	}
	receiptWith184 struct {
		Receipt
		b [184]byte
	}
	receiptWith280 struct {
		Receipt
		b [280]byte
	}
)

// newReceipt is the receipt of the engine's record r. It shares r's
// fingerprint and result.
func newReceipt(r *driver.Record) *Receipt {
	return fillReceipt(new(Receipt), r)
}

// fillReceipt makes rc the receipt of r (newReceipt) and returns it.
func fillReceipt(rc *Receipt, r *driver.Record) *Receipt {
	*rc = receiptFields(r)
	rc.Fingerprint, rc.Result = r.Fingerprint, r.Result
	return rc
}

// receiptFields is the receipt of r without its fingerprint and result.
func receiptFields(r *driver.Record) Receipt {
	return Receipt{
		Key:            Key(r.Key),
		State:          State(r.State),
		Attempts:       r.Attempts,
		Token:          r.Token,
		CreatedAt:      r.CreatedAt,
		UpdatedAt:      r.UpdatedAt,
		ExpiresAt:      r.ExpiresAt,
		LeaseExpiresAt: r.LeaseExpiresAt,
	}
}
