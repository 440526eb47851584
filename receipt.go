package receipts

import (
	"fmt"
	"strconv"
	"time"

	"github.com/receiptstore/receipts/encoding"
)

// Key identifies an operation: Scope is the authenticated caller (account,
// tenant, agent principal), ID the operation key the caller minted when the
// action was approved. Keys of different scopes never see each other. Both
// parts are non-empty and at most MaxKeyPartLen bytes; any bytes are allowed.
// Keep secrets and personal data out of keys: they are stored as given and
// shown by receiptctl.
type Key struct{ Scope, ID string }

// String formats k for messages, quoting each part.
func (k Key) String() string { return strconv.Quote(k.Scope) + "/" + strconv.Quote(k.ID) }

func (k Key) validate() error {
	switch {
	case len(k.Scope) == 0:
		return fmt.Errorf("%w: empty scope", ErrInvalidKey)
	case len(k.ID) == 0:
		return fmt.Errorf("%w: empty id", ErrInvalidKey)
	case len(k.Scope) > MaxKeyPartLen:
		return fmt.Errorf("%w: scope of %d bytes (max %d)", ErrInvalidKey, len(k.Scope), MaxKeyPartLen)
	case len(k.ID) > MaxKeyPartLen:
		return fmt.Errorf("%w: id of %d bytes (max %d)", ErrInvalidKey, len(k.ID), MaxKeyPartLen)
	}
	return nil
}

func validateFingerprint(fp []byte) error {
	switch {
	case len(fp) == 0:
		return fmt.Errorf("%w: nil or empty", ErrInvalidFingerprint)
	case len(fp) > MaxFingerprintLen:
		return fmt.Errorf("%w: %d bytes (max %d)", ErrInvalidFingerprint, len(fp), MaxFingerprintLen)
	}
	return nil
}

func validateResult(result []byte) error {
	if len(result) > MaxResultSize {
		return fmt.Errorf("%w: %d bytes (max %d)", ErrResultTooLarge, len(result), MaxResultSize)
	}
	return nil
}

// State is a record's state.
type State uint8

// Record states. The zero State means "unspecified" (any, in a Filter).
const (
	// Pending: claimed; a lease is live, or has run out (abandoned).
	Pending State = State(encoding.StatePending)
	// Succeeded: committed with a result; replayed to every retry.
	Succeeded State = State(encoding.StateSucceeded)
	// Failed: a definitive failure, replayed like a success.
	Failed State = State(encoding.StateFailed)
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

// unixTime converts store time to a time.Time in loc.
func unixTime(ns int64, loc *time.Location) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).In(loc)
}

func newReceipt(k Key, rec *encoding.Record, retention time.Duration, loc *time.Location) *Receipt {
	return &Receipt{
		Key:            k,
		Fingerprint:    rec.Fingerprint,
		State:          State(rec.State),
		Result:         rec.Result,
		Attempts:       rec.Attempts,
		Token:          rec.Token,
		CreatedAt:      unixTime(rec.CreatedAt, loc),
		UpdatedAt:      unixTime(rec.UpdatedAt, loc),
		ExpiresAt:      unixTime(rec.UpdatedAt+int64(retention), loc),
		LeaseExpiresAt: unixTime(rec.LeaseExpiresAt, loc),
	}
}
