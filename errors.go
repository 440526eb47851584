package receipts

import (
	"errors"
	"fmt"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Sentinel errors. Test for them with errors.Is; the engine wraps them with
// context (the key, the operation) using %w.
var (
	// ErrNotFound is returned by Lookup when no visible record exists for the
	// key: it was never claimed, it was released, or its retention ran out.
	ErrNotFound = errors.New("receipts: not found")

	// ErrIntentMismatch is returned when a key is used again with a different
	// fingerprint ("same key, different intent"), whatever the record's state.
	ErrIntentMismatch = errors.New("receipts: same key, different intent")

	// ErrInProgress is returned when another caller holds a live lease on the
	// key. It always arrives wrapped in an *InProgressError that says when to
	// retry.
	ErrInProgress = errors.New("receipts: operation in progress")

	// ErrLeaseLost is returned by Renew, Commit, Fail, CommitWith and Release
	// when the lease's fencing token is stale: another caller took the key
	// over, or the record is gone (released, or past retention). Nothing was
	// written. It is driver.ErrLeaseLost, which engines return.
	ErrLeaseLost = driver.ErrLeaseLost

	// ErrInvalidArgument is the parent of every bad-input error
	// (ErrInvalidKey, ErrInvalidFingerprint, ErrResultTooLarge,
	// ErrInvalidOptions). Bad input never changes the store.
	ErrInvalidArgument = errors.New("receipts: invalid argument")

	// ErrInvalidKey is returned for an empty or over-long (MaxKeyPartLen)
	// Scope or ID. An invalid fingerprint also matches it, since the
	// fingerprint is part of what a key's request is identified by.
	ErrInvalidKey = &sentinel{msg: "receipts: invalid key", parents: []error{ErrInvalidArgument}}

	// ErrInvalidFingerprint is returned for a nil, empty or over-long
	// (MaxFingerprintLen) fingerprint. It matches ErrInvalidKey and
	// ErrInvalidArgument too.
	ErrInvalidFingerprint = &sentinel{msg: "receipts: invalid fingerprint", parents: []error{ErrInvalidKey}}

	// ErrResultTooLarge is returned when a result exceeds MaxResultSize.
	ErrResultTooLarge = &sentinel{msg: "receipts: result too large", parents: []error{ErrInvalidArgument}}

	// ErrInvalidOptions is returned by Open for options that cannot work
	// (negative durations, LeaseTTL >= Retention, ...).
	ErrInvalidOptions = &sentinel{msg: "receipts: invalid options", parents: []error{ErrInvalidArgument}}

	// ErrOutcomeUnknown is wrapped by every error Do, DoBatch, Lease.Run and
	// Lease.RunBatch return when the effect may have happened but no outcome
	// is recorded: fn returned an error not marked NotPerformed or Permanent,
	// its result is larger than MaxResultSize, or recording it failed. The
	// claim is abandoned (unless another caller already took the key over),
	// so the next attempt gets Lease.Recovered() == true and reconciles. It
	// is not a bad-input error: it never matches ErrInvalidArgument (a
	// service answers it like a 5xx, not a 400). A direct Lease.Commit of an
	// oversized result changes nothing and returns ErrResultTooLarge.
	ErrOutcomeUnknown = errors.New("receipts: outcome unknown")

	// ErrClosed is returned by every method called after Close. It is
	// driver.ErrClosed, which engines return.
	ErrClosed = driver.ErrClosed

	// ErrCorrupt marks bytes read from disk that do not decode: a record or
	// the store's meta data. A corrupt record is never read as absent. It is
	// driver.ErrCorrupt, which engines return.
	ErrCorrupt = driver.ErrCorrupt

	// ErrFailed is wrapped by the error Do returns together with a Failed
	// receipt, the first time and on every replay.
	ErrFailed = errors.New("receipts: operation failed")

	// ErrExpired is returned by Claim, Do and DoBatch for a key that was
	// used but whose receipt is gone: its retention ended within the
	// TombstoneWindow, or Options.KeyTime says it was minted more than
	// Retention + TombstoneWindow ago. Whatever the fingerprint, nothing
	// runs: the action may have happened, and its result is no longer
	// known. A service answers it as 410 Gone (receipthttp does). Lookup of
	// such a key returns an error matching both ErrNotFound and ErrExpired.
	// It always arrives wrapped in an *ExpiredError.
	ErrExpired = errors.New("receipts: key expired (this key was used; its receipt is gone)")

	// ErrUnknownFormat is returned by Open for a store written in a format
	// this version does not know (a newer one).
	ErrUnknownFormat = driver.ErrUnknownFormat

	// ErrLocked is returned by Open (and pebblestore.Open) when another
	// process (or another DB in this process) holds the directory. Inspect a
	// running service through its admin handler (package receiptadmin), or
	// open a checkpoint of it (pebblestore.Checkpoint).
	ErrLocked = driver.ErrLocked

	// ErrUnsupported is returned by a method the store's engine cannot
	// serve: an engine package's own forms on another engine
	// (pebblestore.DoBatch on PostgreSQL, pgstore.DoTx on Pebble), an
	// Effect written for another engine, and Open in a program built with
	// the receipts_nopebble tag.
	ErrUnsupported = errors.New("receipts: not supported by this engine")

	// ErrErased is returned for a key whose scope was erased (DB.EraseScope): by Claim,
	// Do and DoBatch while the erasure is in force (the key may have been used, and
	// nothing of it is kept, so nothing runs), by Lookup, and for a result whose scope's
	// data key is destroyed. It arrives wrapped in an *ErasedError, which matches
	// ErrExpired too (a service answers it as it answers an expired key: receipthttp
	// with 410 Gone). It is driver.ErrErased, which engines return.
	ErrErased = driver.ErrErased

	// ErrSealed is returned for a result stored encrypted (Options.Keyring) by a DB
	// opened without a Keyring, which cannot open it.
	ErrSealed = driver.ErrSealed
)

// sentinel is an error value that also matches its parents under errors.Is.
type sentinel struct {
	msg     string
	parents []error
}

func (e *sentinel) Error() string { return e.msg }

func (e *sentinel) Is(target error) bool {
	for _, p := range e.parents {
		if errors.Is(p, target) {
			return true
		}
	}
	return false
}

// InProgressError reports that another caller holds a live lease on Key. It
// wraps ErrInProgress (and, when the caller's context ended while waiting,
// the context's error).
type InProgressError struct {
	Key Key
	// RetryAfter estimates, by the store's clock, when the answer will be
	// there: a moving average of how long an attempt of the caller's
	// operation class (WithOperationClass) takes from claim to recorded
	// outcome (updated on every Commit, Fail, Release and Abandon; the
	// store's average over every class until one of the class is measured),
	// minus how long the holder's attempt has already run, going
	// by the record's times (an attempt already past the average gets one
	// more average). It is at least 1ms and never later than the end of the
	// holder's lease, which it equals until an outcome has been measured. A
	// caller retrying after it most likely finds the receipt; if not, it gets
	// a fresh estimate (and once the lease has run out, the key).
	RetryAfter time.Duration
	cause      error
	db         *DB // names Key in Error (its hash, unless Options.LogKeys); nil: Key.String()
}

// Error says which key is in progress and when to retry. A store names the
// key by its keyed hash (see DB.LogKey), unless Options.LogKeys is set.
func (e *InProgressError) Error() string {
	msg := fmt.Sprintf("receipts: operation in progress for %s (retry after %s)", e.db.keyName(e.Key), e.RetryAfter)
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

// Unwrap returns ErrInProgress and, if waiting was cut short, the context's
// error.
func (e *InProgressError) Unwrap() []error {
	if e.cause != nil {
		return []error{ErrInProgress, e.cause}
	}
	return []error{ErrInProgress}
}

// ExpiredError reports that Key was used and its receipt is gone (a
// tombstone, or an old key by Options.KeyTime). It wraps ErrExpired (and,
// from Lookup, ErrNotFound).
type ExpiredError struct {
	Key Key
	// ExpiredAt is when the receipt's retention ended; zero when KeyTime
	// answered (no lookup was made).
	ExpiredAt time.Time
	// Until is when the key is free again (ExpiredAt + TombstoneWindow);
	// zero when KeyTime answered (never, for that key).
	Until    time.Time
	notFound bool
	db       *DB // names Key in Error (its hash, unless Options.LogKeys); nil: Key.String()
}

// Error says which key expired and since when. A store names the key by its
// keyed hash (see DB.LogKey), unless Options.LogKeys is set.
func (e *ExpiredError) Error() string {
	if e.ExpiredAt.IsZero() {
		return fmt.Sprintf("%s: %s (minted more than Retention + TombstoneWindow ago)", ErrExpired, e.db.keyName(e.Key))
	}
	return fmt.Sprintf("%s: %s (receipt expired at %s; the key is marked used until %s)",
		ErrExpired, e.db.keyName(e.Key), e.ExpiredAt.UTC().Format(time.RFC3339Nano), e.Until.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrExpired, and ErrNotFound from Lookup.
func (e *ExpiredError) Unwrap() []error {
	if e.notFound {
		return []error{ErrExpired, ErrNotFound}
	}
	return []error{ErrExpired}
}

// outcomeError carries fn's error from Do, marked NotPerformed or Permanent.
type outcomeError struct {
	kind outcomeKind
	err  error
}

type outcomeKind uint8

const (
	kindNotPerformed outcomeKind = iota + 1
	kindPermanent
)

func (e *outcomeError) Error() string {
	if e.err == nil {
		if e.kind == kindPermanent {
			return "permanent failure"
		}
		return "not performed"
	}
	return e.err.Error()
}

func (e *outcomeError) Unwrap() error { return e.err }

// NotPerformed marks an error returned by Do's fn as "nothing happened": Do
// releases the claim, so the key is free for a later attempt, and returns an
// error wrapping err.
func NotPerformed(err error) error { return &outcomeError{kind: kindNotPerformed, err: err} }

// Permanent marks an error returned by Do's fn as a definitive failure: Do
// stores a Failed receipt (its result is the bytes fn returned, or err's text
// if fn returned none), replayed like a success, and returns it with an error
// wrapping both ErrFailed and err.
func Permanent(err error) error { return &outcomeError{kind: kindPermanent, err: err} }

func outcomeOf(err error) (outcomeKind, bool) {
	if err == nil {
		return 0, false // no errors.As: its target would escape, an allocation per Do
	}
	var oe *outcomeError
	if errors.As(err, &oe) {
		return oe.kind, true
	}
	return 0, false
}

// IsNotPerformed reports that the error was marked NotPerformed, and
// IsPermanent that it was marked Permanent: how Do treats it. They let an
// engine package that applies Do's policy itself (pgstore.DoTx) read the
// mark with errors.As and an interface, without another exported name.
func (e *outcomeError) IsNotPerformed() bool { return e.kind == kindNotPerformed }

// IsPermanent: see IsNotPerformed.
func (e *outcomeError) IsPermanent() bool { return e.kind == kindPermanent }
