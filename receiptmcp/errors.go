package receiptmcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// JSON-RPC error codes the middleware answers with. Key problems are
// invalid params (the request cannot be served as sent); the others are
// application errors, outside JSON-RPC's reserved -32768..-32000, that a
// client should retry.
const (
	// CodeInvalidParams (-32602) is used for a missing, malformed or
	// conflicting operation key.
	CodeInvalidParams int64 = jsonrpc.CodeInvalidParams
	// CodeInProgress: another call with the same key is still running.
	// Retry with the same key after data.retryAfterMs.
	CodeInProgress int64 = -31409
	// CodeExpired: the key was used, and its receipt is past retention
	// (receipts.ErrExpired): the tool is not run again. Do not retry with
	// the same key; mint a new one only for a new action.
	CodeExpired int64 = -31410
	// CodeUnauthenticated: the call has no authenticated principal to scope
	// its key by.
	CodeUnauthenticated int64 = -31401
	// CodeNotRecorded: the tool ran but its outcome could not be recorded,
	// and its effects staged with Attempt.Stage were not applied; or a step
	// of its action has an unknown outcome (data.step names it). Retry
	// with the same key: the retry resumes at the step.
	CodeNotRecorded int64 = -31503
	// CodeInternal (-32603) is used when a stored result cannot be read or
	// the store fails.
	CodeInternal int64 = jsonrpc.CodeInternalError
)

// Values of ErrorData.Type.
const (
	// TypeKeyMissing: a Required tool was called without an operation key.
	TypeKeyMissing = "idempotency_key_missing"
	// TypeKeyInvalid: the key is not a string, is empty or is too long.
	TypeKeyInvalid = "idempotency_key_invalid"
	// TypeKeyConflict: the key was used for another tool or other arguments.
	TypeKeyConflict = "idempotency_key_conflict"
	// TypeKeyExpired: the key was used and its receipt is gone
	// (CodeExpired).
	TypeKeyExpired = "idempotency_key_expired"
	// TypeKeyErased: the key's scope was erased (receipts.ErrErased), with
	// CodeExpired: the tool is not run again while the erasure is in force.
	TypeKeyErased = "idempotency_key_erased"
	// TypeInProgress: a call with the key is still running (CodeInProgress).
	TypeInProgress = "idempotency_key_in_progress"
	// TypeScopeMissing: no authenticated principal (CodeUnauthenticated).
	TypeScopeMissing = "idempotency_scope_missing"
	// TypeNotRecorded: the outcome could not be recorded (CodeNotRecorded).
	TypeNotRecorded = "idempotency_outcome_not_recorded"
	// TypeStepMismatch: the tool called a step that does not match the
	// key's journal (receipts.ErrStepMismatch; data.step names it), with
	// CodeInternal: the server's code changed while the action was in
	// flight. Nothing ran; the claim stays abandoned until an operator
	// settles it, and a retry with the same key gets the same answer.
	TypeStepMismatch = "idempotency_step_mismatch"
	// TypeStoreFailure: the receipt store failed (CodeInternal).
	TypeStoreFailure = "idempotency_store_failure"
	// TypeInvalidArguments: the arguments are not valid JSON.
	TypeInvalidArguments = "invalid_arguments"
)

// ErrorData is the data member of every JSON-RPC error the middleware
// returns.
type ErrorData struct {
	// Type says what went wrong; one of the Type constants.
	Type string `json:"type"`
	// Tool is the name of the tool called.
	Tool string `json:"tool,omitempty"`
	// MetaKey is the params._meta entry the operation key belongs in.
	MetaKey string `json:"metaKey,omitempty"`
	// RetryAfterMs, for TypeInProgress and TypeNotRecorded, is how long to
	// wait before retrying with the same key, in milliseconds (at least 1).
	RetryAfterMs int64 `json:"retryAfterMs,omitempty"`
	// Step, for TypeNotRecorded and TypeStepMismatch, names the step of the
	// tool's action (Attempt.Step) whose outcome is unknown, or that did not
	// match the key's journal.
	Step string `json:"step,omitempty"`
}

// RetryAfter returns RetryAfterMs as a duration.
func (d *ErrorData) RetryAfter() time.Duration {
	return time.Duration(d.RetryAfterMs) * time.Millisecond
}

// ParseError returns the ErrorData of an error that a client got from a
// tools/call answered by the middleware, and ok == false for any other
// error.
func ParseError(err error) (code int64, data *ErrorData, ok bool) {
	var je *jsonrpc.Error
	if !errors.As(err, &je) || len(je.Data) == 0 {
		return 0, nil, false
	}
	var d ErrorData
	if json.Unmarshal(je.Data, &d) != nil || d.Type == "" {
		return 0, nil, false
	}
	return je.Code, &d, true
}

// newError builds the wire error. Marshaling ErrorData cannot fail.
func newError(code int64, msg string, data ErrorData) *jsonrpc.Error {
	b, _ := json.Marshal(data)
	return &jsonrpc.Error{Code: code, Message: "receiptmcp: " + msg, Data: b}
}

func retryAfterMs(d time.Duration) int64 {
	ms := math.Ceil(float64(d) / float64(time.Millisecond))
	switch {
	case ms < 1:
		return 1
	case ms > float64(24*time.Hour/time.Millisecond):
		return int64(24 * time.Hour / time.Millisecond)
	}
	return int64(ms)
}

func errKeyMissing(c *config, tool string) error {
	return newError(CodeInvalidParams,
		fmt.Sprintf("tool %q requires an operation key in params._meta[%q]", tool, c.MetaKey),
		ErrorData{Type: TypeKeyMissing, Tool: tool, MetaKey: c.MetaKey})
}

func errKeyInvalid(c *config, tool string, why string) error {
	return errKeyInvalidAt(tool, c.MetaKey, why)
}

// errKeyInvalidAt refuses the key the client sent in params._meta[metaKey].
func errKeyInvalidAt(tool, metaKey, why string) error {
	if metaKey == ParamsKeyMetaKey {
		return newError(CodeInvalidParams,
			fmt.Sprintf("invalid operation key in params.idempotencyKey (or params._meta[%q]): %s", metaKey, why),
			ErrorData{Type: TypeKeyInvalid, Tool: tool, MetaKey: metaKey})
	}
	return newError(CodeInvalidParams,
		fmt.Sprintf("invalid operation key in params._meta[%q]: %s", metaKey, why),
		ErrorData{Type: TypeKeyInvalid, Tool: tool, MetaKey: metaKey})
}
