package intents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	// that wraps *RetryError says when; one that wraps *StepError names
	// the step of the service's action whose outcome is unknown. Deliver
	// must honour ctx, which ends at the attempt's timeout or the action's
	// deadline.
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

// StepError is a Transport's error for an answer that says the outcome is
// unknown and names the step of the service's action that was uncertain
// (the "step" of an HTTP problem details body, or of an MCP error's data).
// The Dispatcher records Step in Action.UncertainStep.
type StepError struct {
	// Step is the name of the uncertain step, as the service gave it.
	Step string
	// Err is the attempt's error: why there was no answer.
	Err error
}

// Error implements error.
func (e *StepError) Error() string {
	return fmt.Sprintf("%v (step %q uncertain)", e.Err, e.Step)
}

// Unwrap returns e.Err.
func (e *StepError) Unwrap() error { return e.Err }

// uncertainStep returns the step of a *StepError in err's chain, "" if none.
func uncertainStep(err error) string {
	var s *StepError
	if errors.As(err, &s) {
		return s.Step
	}
	return ""
}

// maxStepLen bounds the step name a Transport takes from an answer (as
// receipts bounds a step's name: MaxKeyPartLen).
const maxStepLen = 512

// StepOf returns the "step" member of a JSON object, data (an HTTP problem
// details body, an MCP error's data), if it is a non-empty string of at
// most 512 bytes; "" for anything else. Transports use it to read which step
// of an action a service reported uncertain.
func StepOf(data []byte) string {
	var v struct {
		Step any `json:"step"`
	}
	if len(data) == 0 || json.Unmarshal(data, &v) != nil {
		return ""
	}
	s, ok := v.Step.(string)
	if !ok || len(s) > maxStepLen || strings.TrimSpace(s) == "" {
		return ""
	}
	return s
}
