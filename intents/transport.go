package intents

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Transport delivers an action to its service: HTTPTransport (the
// Idempotency-Key header), intentsmcp.Transport (an MCP tool call with the
// key in _meta), or the application's own.
type Transport interface {
	// Deliver sends a's request once, with a.Key as its operation key, and
	// returns the service's definitive answer (Answer.State Succeeded,
	// Failed, Conflict or Expired). Anything else is an error: no answer
	// yet (a timeout, a refused connection, a 5xx, the key in progress),
	// and the Dispatcher tries again later with the same key. An error
	// that wraps *RetryError says when. Deliver must honour ctx, which
	// ends at the attempt's timeout or the action's deadline.
	Deliver(ctx context.Context, a *Action) (*Answer, error)
}

// RetryError is a Transport's error that says when to try again: the
// service's Retry-After, or the retryAfterMs of an MCP error. The
// Dispatcher waits at least After (and never past the deadline).
type RetryError struct {
	After time.Duration
	Err   error
}

// Error implements error.
func (e *RetryError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.Err, e.After)
}

// Unwrap returns e.Err.
func (e *RetryError) Unwrap() error { return e.Err }

// retryAfter returns the hint of a *RetryError in err's chain.
func retryAfter(err error) time.Duration {
	var r *RetryError
	if errors.As(err, &r) && r.After > 0 {
		return r.After
	}
	return 0
}
