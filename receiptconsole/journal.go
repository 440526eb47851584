package receiptconsole

import (
	"context"
	"errors"
	"iter"
	"time"
)

// Journal is a host's journal of approved actions (package intents) as the Host half page
// uses it. Package receiptconsole/consoleintents adapts an *intents.Journal:
//
//	receiptconsole.Options{Journal: consoleintents.Journal(j)}
//
// It is an interface so that the console links no journal (nor intents' Pebble store)
// unless the application gives one.
type Journal interface {
	// Actions yields the actions in state ("uncertain", "expired" or "conflict"), in
	// approval order.
	Actions(ctx context.Context, state string) iter.Seq2[*Action, error]
	// Action returns the action with key, or an error wrapping ErrNoAction.
	Action(ctx context.Context, key string) (*Action, error)
	// Redeliver puts an uncertain action back into delivery under its own key, for
	// within from now.
	Redeliver(ctx context.Context, key string, within time.Duration) error
	// Settle records what happened to an uncertain action: succeeded or failed, found
	// out by the person by, with what they found.
	Settle(ctx context.Context, key string, succeeded bool, by string, found []byte) error
	// Forget removes an answered action.
	Forget(ctx context.Context, key string) error
}

// Action is one action of a Journal, as the Host half page shows it.
type Action struct {
	Key                             string // the action's operation key
	Target, Operation, ApprovedBy   string
	State                           string // "approved", "succeeded", "failed", "conflict", "expired" or "uncertain"
	ApprovedAt, Deadline, UpdatedAt time.Time
	Attempts                        uint32
	LastError                       string // why the last attempt got no answer
	UncertainStep                   string // the step of the service's action it reported uncertain, if it named one
	Answer                          string // the answer in a few words (status, code, who settled it)
}

// Errors a Journal returns (wrapped), for the page to say what happened.
var (
	// ErrNoAction: no action has the key.
	ErrNoAction = errors.New("receiptconsole: no such action")
	// ErrActionState: the action is not in a state the change applies to (redeliver and
	// settle take uncertain actions, forget answered ones).
	ErrActionState = errors.New("receiptconsole: the action is in another state")
)
