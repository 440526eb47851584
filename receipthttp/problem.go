package receipthttp

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem type URIs used by the middleware. They are tag URIs (RFC 4151):
// stable identifiers for programs to match on, not pages to fetch.
const (
	ProblemKeyMissing = "tag:receiptstore.github.io,2026:receipthttp/key-missing"
	ProblemKeyInvalid = "tag:receiptstore.github.io,2026:receipthttp/key-invalid"
	ProblemKeyReused  = "tag:receiptstore.github.io,2026:receipthttp/key-reused"
	ProblemInProgress = "tag:receiptstore.github.io,2026:receipthttp/in-progress"
	// ProblemKeyExpired (410 Gone): the key was used, and its stored
	// response is past retention (a tombstone, receipts.ErrExpired). The
	// request is not processed again: mint a new key only if the action is
	// meant to happen again.
	ProblemKeyExpired = "tag:receiptstore.github.io,2026:receipthttp/key-expired"
	// ProblemKeyErased (410 Gone): the key's scope was erased
	// (receipts.DB.EraseScope, receipts.ErrErased): whatever was stored of
	// it is gone, and the request is not processed again while the erasure
	// is in force.
	ProblemKeyErased    = "tag:receiptstore.github.io,2026:receipthttp/key-erased"
	ProblemBodyTooLarge = "tag:receiptstore.github.io,2026:receipthttp/body-too-large"
	ProblemBadRequest   = "tag:receiptstore.github.io,2026:receipthttp/bad-request"
	ProblemUnauthorized = "tag:receiptstore.github.io,2026:receipthttp/unauthorized"
	// ProblemNotRecorded (503, with Retry-After): the outcome could not be
	// recorded, or a step of the action has an unknown outcome (then
	// Problem.Step names it); the claim is abandoned. Retry with the same
	// key: the retry runs as a recovered attempt, and resumes at the step.
	ProblemNotRecorded = "tag:receiptstore.github.io,2026:receipthttp/not-recorded"
	// ProblemStepMismatch (500): the handler called a step that does not
	// match the key's journal (receipts.ErrStepMismatch; Problem.Step names
	// it): the service's code changed while the action was in flight.
	// Nothing ran, and the claim stays abandoned until an operator settles
	// it; a retry with the same key gets the same answer.
	ProblemStepMismatch = "tag:receiptstore.github.io,2026:receipthttp/step-mismatch"
	ProblemUnavailable  = "tag:receiptstore.github.io,2026:receipthttp/unavailable"
	ProblemInternal     = "tag:receiptstore.github.io,2026:receipthttp/internal"
)

// Problem is an error response in the shape of RFC 9457 "Problem Details for
// HTTP APIs". The middleware builds one for every request it answers itself
// and hands it to Config.ErrorResponder.
type Problem struct {
	// Type is a URI identifying the kind of problem (one of the Problem* constants).
	Type string `json:"type"`
	// Title is a short, human-readable summary of the kind of problem.
	Title string `json:"title"`
	// Status is the HTTP status code of the response.
	Status int `json:"status"`
	// Detail explains this occurrence of the problem.
	Detail string `json:"detail,omitempty"`
	// Step, for ProblemNotRecorded and ProblemStepMismatch, names the step
	// of the action (Attempt.Step) whose outcome is unknown, or that did not
	// match the key's journal.
	Step string `json:"step,omitempty"`
	// RetryAfter, when positive, is sent as the Retry-After header (whole
	// seconds, rounded up).
	RetryAfter int `json:"-"`
	// Err is the underlying error, if any. It is never sent to the client.
	Err error `json:"-"`
}

// Error implements error, so a Config.Scope function may return a *Problem
// to choose the response sent for a request it refuses.
func (p *Problem) Error() string {
	if p.Detail != "" {
		return p.Title + ": " + p.Detail
	}
	return p.Title
}

// Unwrap returns p.Err.
func (p *Problem) Unwrap() error { return p.Err }

// WriteProblem is the default Config.ErrorResponder: it writes p as
// application/problem+json, with Retry-After when p.RetryAfter > 0.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p *Problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	body, err := json.Marshal(p)
	if err != nil { // unreachable: every field is a string or an int
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}
