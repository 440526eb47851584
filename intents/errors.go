package intents

import "errors"

// Errors returned by this package, for errors.Is. Bad input is reported
// before anything is written: an error from Approve, Settle, Redeliver or
// Forget means the journal did not change.
var (
	// ErrInvalid is wrapped by every error about bad input below, and
	// returned for other bad input (an unknown state name, a nil store).
	ErrInvalid = errors.New("intents: invalid input")
	// ErrEmptyTarget: an Approval without a Target.
	ErrEmptyTarget = errors.New("intents: empty target")
	// ErrEmptyOperation: an Approval without an Operation.
	ErrEmptyOperation = errors.New("intents: empty operation")
	// ErrNoApprover: an Approval without ApprovedBy: every action says who
	// approved it.
	ErrNoApprover = errors.New("intents: no approver")
	// ErrBadArguments: arguments that do not encode as JSON (a channel, a
	// function, NaN, a json.RawMessage that is not JSON), or whose encoding
	// is larger than MaxArgumentsSize.
	ErrBadArguments = errors.New("intents: arguments do not encode")
	// ErrDeadlinePassed: a deadline that is not in the future.
	ErrDeadlinePassed = errors.New("intents: deadline is not in the future")
	// ErrTooLong: a Target, Operation, ApprovedBy or Ref longer than
	// MaxFieldLen.
	ErrTooLong = errors.New("intents: field too long")
	// ErrRefConflict: Approve with a Ref the journal holds for another
	// request (another target, operation or arguments). Nothing changed;
	// the action approved under the Ref keeps its key.
	ErrRefConflict = errors.New("intents: ref already approved for another request")
	// ErrNotFound: no action has this key.
	ErrNotFound = errors.New("intents: no such action")
	// ErrWrongState: the action is not in a state the call applies to
	// (Settle and Redeliver take Uncertain actions, Forget answered ones).
	ErrWrongState = errors.New("intents: action is in another state")
	// ErrLocked: another process holds the journal's directory.
	ErrLocked = errors.New("intents: journal is locked by another process")
	// ErrClosed: the journal or dispatcher is closed.
	ErrClosed = errors.New("intents: closed")
	// ErrCorrupt: a stored action cannot be read. It is never taken for an
	// absent one.
	ErrCorrupt = errors.New("intents: corrupt journal")
	// ErrUnknownFormat: the journal was written by a newer version.
	ErrUnknownFormat = errors.New("intents: unknown journal format")
	// ErrNoTransport: the Dispatcher has no Transport for the action's
	// Target. The action stays Approved (and turns Uncertain at its
	// deadline, since it cannot tell whether an earlier process sent it).
	ErrNoTransport = errors.New("intents: no transport for the action's target")
	// ErrHostNameInUse: NewDispatcher with the HostName of another open
	// Dispatcher of this process. Two Dispatchers under one name would
	// both hold each action's delivery lease.
	ErrHostNameInUse = errors.New("intents: host name in use by another dispatcher")
)

// invalid marks err as bad input (errors.Is(err, ErrInvalid)).
type invalid struct{ err error }

func (e invalid) Error() string   { return e.err.Error() }
func (e invalid) Unwrap() []error { return []error{e.err, ErrInvalid} }
func bad(err error) error         { return invalid{err} }
