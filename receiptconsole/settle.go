package receiptconsole

// Settling one abandoned claim by hand, in the form its front end replays: what the
// console's Settle page and `receiptctl reconcile SCOPE ID` both do. Settle takes over
// exactly the listed attempt (receipts.DB.TakeOver), then records a raw result, an HTTP
// response (receipthttp), a tool result (receiptmcp), or nothing (the effect did not
// happen: the key is forgotten).
//
// Each caller words its own refusals (flags for receiptctl, form fields for the console):
// the checks that depend on how the settlement was asked for return typed errors
// (*WrongFormError, and errors wrapping ErrDeclined, ErrNoOutcome and ErrBadInput).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/receiptstore/receipts/receiptmcp"
)

// The front ends whose keys are recognised (receipthttp.Owns, receiptmcp.Owns).
const (
	FaceHTTP = "receipthttp"
	FaceMCP  = "receiptmcp"
)

// FaceOf names the front end that claimed r's key, "" if none did (the library's Do, or
// a front end older than the marks).
func FaceOf(r *receipts.Receipt) string {
	switch {
	case receipthttp.Owns(r):
		return FaceHTTP
	case receiptmcp.Owns(r):
		return FaceMCP
	}
	return ""
}

// Errors of the checks made before anything is taken over.
var (
	// ErrBadInput: the settlement given cannot be stored (a header line without a
	// colon, a response or tool result the front end cannot encode).
	ErrBadInput = errors.New("receiptconsole: bad input")
	// ErrDeclined: an HTTP status that means the handler declined (409, 429), which
	// receipthttp does not store: the claim is to be settled as not performed.
	ErrDeclined = errors.New("receiptconsole: the status means the handler declined")
	// ErrNoOutcome: an HTTP status that is no outcome (5xx), which receipthttp does not
	// store.
	ErrNoOutcome = errors.New("receiptconsole: the status is no outcome")
	// ErrStepsRecorded: a claim whose action recorded finished steps (Lease.Step) cannot be
	// settled as not performed: they happened, and forgetting the claim would drop their
	// records, so the next call would run them again. Settle its uncertain step instead
	// (SettleStep), or record the action's outcome.
	ErrStepsRecorded = errors.New("receiptconsole: the claim's action has recorded steps")
)

// Settlement is how a claim is settled: a raw result (State, Result), a front end's form (HTTP
// or MCP), or not performed. Exactly one is meant to be set.
type Settlement struct {
	State        receipts.State // Succeeded or Failed, with Result (the library's form)
	Result       []byte
	NotPerformed bool
	HTTP         *HTTPResponse       // receipthttp's form
	MCP          *mcp.CallToolResult // receiptmcp's form
}

// face is the front end whose form h is in ("" for a raw result or not performed).
func (h Settlement) face() string {
	switch {
	case h.HTTP != nil:
		return FaceHTTP
	case h.MCP != nil:
		return FaceMCP
	}
	return ""
}

// WrongFormError refuses to settle a front end's key in another form: its retries would
// be answered with an error for the whole retention.
type WrongFormError struct {
	Key  receipts.Key
	Face string // the front end that claimed the key
}

// Error says which form the key needs, in words that name no flag or field.
func (e *WrongFormError) Error() string {
	return fmt.Sprintf("%s was claimed by %s: its retries are answered with %s stored in its receipt, and anything else would be answered with an error; settle it in that form, or as not performed: nothing written",
		e.Key, e.Face, formName(e.Face))
}

// formName describes what a front end's retries are answered with.
func formName(face string) string {
	switch face {
	case FaceHTTP:
		return "an HTTP response"
	case FaceMCP:
		return "a tool result"
	}
	return "the stored result"
}

// fits refuses (a *WrongFormError) to settle a key that face claimed in another form.
func (h Settlement) fits(k receipts.Key, face string) error {
	if h.NotPerformed || face == "" || face == h.face() {
		return nil
	}
	return &WrongFormError{Key: k, Face: face}
}

// HTTPResponse is the HTTP response a receipthttp key is settled with.
type HTTPResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

// ParseHeaders reads header lines of the form "Name: value".
func ParseHeaders(lines []string) (http.Header, error) {
	h := http.Header{}
	for _, line := range lines {
		name, value, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("%w: header %q: want 'Name: value'", ErrBadInput, line)
		}
		h.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return h, nil
}

// NewHTTPResponse checks the response a receipthttp key is to be settled with, before
// anything is taken over: ErrDeclined for 409 and 429, ErrNoOutcome for 5xx (receipthttp
// stores neither), ErrBadInput for what receipthttp cannot store.
func NewHTTPResponse(status int, header http.Header, body []byte) (*HTTPResponse, error) {
	switch receipthttp.DefaultPolicy(status) {
	case receipthttp.Release:
		return nil, fmt.Errorf("%w: status %d means the handler declined, which receipthttp does not store", ErrDeclined, status)
	case receipthttp.Abandon:
		return nil, fmt.Errorf("%w: status %d is no outcome (receipthttp stores none for 5xx): settle with what happened", ErrNoOutcome, status)
	}
	if header == nil {
		header = http.Header{}
	}
	if _, err := receipthttp.EncodeResponse(status, header, body); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return &HTTPResponse{Status: status, Header: header, Body: body}, nil
}

// ParseToolResult parses and checks the tool result (CallToolResult JSON) a receiptmcp key is
// to be settled with.
func ParseToolResult(js string) (*mcp.CallToolResult, error) {
	var res mcp.CallToolResult
	if err := json.Unmarshal([]byte(js), &res); err != nil {
		return nil, fmt.Errorf("%w: not a tool result (CallToolResult JSON): %w", ErrBadInput, err)
	}
	if _, err := receiptmcp.EncodeResult(&res); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return &res, nil
}

// Outcome is what settling one claim did.
type Outcome struct {
	Key      receipts.Key
	Face     string // the front end that claimed the key, "" if none
	Attempts uint32 // the attempt that settled it
	Token    uint64
	// Receipt is the receipt recorded; nil when the claim was settled as not performed
	// (the key is free).
	Receipt *receipts.Receipt
}

// Settled names the outcome: "succeeded", "failed" or "not_performed".
func (o Outcome) Settled() string {
	if o.Receipt == nil {
		return "not_performed"
	}
	return o.Receipt.State.String()
}

// Settle settles the abandoned claim of k: it reads the record, checks that it is still the
// attempt with token (when token is not 0) and that how fits its front end (a
// *WrongFormError otherwise), and, for not performed, that its action recorded no finished
// step (ErrStepsRecorded otherwise), takes it over (fenced: nothing is written if another
// attempt came in, or the claim was settled, since) and records how. opts may give
// receipts.LeaseFor. Every refusal writes nothing; a failure to record leaves the claim
// abandoned.
func Settle(ctx context.Context, db *receipts.DB, k receipts.Key, token uint64, how Settlement, opts ...receipts.ClaimOption) (Outcome, error) {
	r, err := db.Inspect(ctx, k)
	switch {
	case errors.Is(err, receipts.ErrNotFound):
		return Outcome{}, fmt.Errorf("%s: not found: no claim to settle: %w", k, err)
	case err != nil:
		return Outcome{}, err
	case r.State != receipts.Pending:
		return Outcome{}, fmt.Errorf("%s is already settled (%s): nothing to do", k, r.State)
	case token != 0 && r.Token != token:
		return Outcome{}, fmt.Errorf("%s: the listed attempt (token %d) is gone; attempt %d (token %d) holds it now: nothing written",
			k, token, r.Attempts, r.Token)
	}
	face := FaceOf(r)
	if err := how.fits(k, face); err != nil {
		return Outcome{}, err
	}
	if how.NotPerformed {
		if err := noRecordedSteps(ctx, db, k); err != nil {
			return Outcome{}, err
		}
	}
	l, err := db.TakeOver(ctx, r, opts...)
	var ip *receipts.InProgressError
	switch {
	case errors.As(err, &ip):
		return Outcome{}, fmt.Errorf("%s: its holder's lease is live (attempt %d, token %d): it is not abandoned; try after %s: %w",
			k, r.Attempts, r.Token, ip.RetryAfter.Round(time.Millisecond), err)
	case errors.Is(err, receipts.ErrLeaseLost):
		return Outcome{}, fmt.Errorf("%s: another attempt took the claim, or it was settled, since it was read: nothing written: %w", k, err)
	case err != nil:
		return Outcome{}, err
	}
	out := Outcome{Key: k, Face: face, Attempts: l.Attempt(), Token: l.Token()}
	if how.NotPerformed {
		if err := l.Forget(ctx); err != nil {
			return Outcome{}, fmt.Errorf("%s: freeing the key: %w", k, err)
		}
		return out, nil
	}
	var rec *receipts.Receipt
	switch {
	case how.HTTP != nil:
		rec, err = receipthttp.SettleResponse(ctx, l, how.HTTP.Status, how.HTTP.Header, how.HTTP.Body)
	case how.MCP != nil:
		rec, err = receiptmcp.SettleResult(ctx, l, how.MCP)
	case how.State == receipts.Failed:
		rec, err = l.Fail(ctx, how.Result)
	default:
		rec, err = l.Commit(ctx, how.Result)
	}
	if err != nil {
		_ = l.Abandon(context.WithoutCancel(ctx))
		return Outcome{}, fmt.Errorf("%s: recording the outcome: %w (the claim stays abandoned)", k, err)
	}
	out.Receipt = rec
	return out, nil
}

// noRecordedSteps refuses (ErrStepsRecorded) to forget the claim of k when its action
// recorded finished steps.
func noRecordedSteps(ctx context.Context, db *receipts.DB, k receipts.Key) error {
	steps, err := db.Steps(ctx, k)
	if err != nil {
		return err
	}
	var done []string
	for _, s := range steps {
		if s.State != receipts.Pending {
			done = append(done, fmt.Sprintf("%d %q (%s)", s.Index, s.Name, s.State))
		}
	}
	if len(done) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: its action recorded %s, which happened: settled as not performed, the key would be forgotten with them and the next call would run them again; settle its uncertain step instead, or record the action's outcome: nothing written",
		ErrStepsRecorded, k, strings.Join(done, ", "))
}

// retryGets says what a retry of a key settled by how gets afterwards, for a person.
func retryGets(how Settlement, face string) string {
	switch {
	case how.NotPerformed:
		return "the key is free: the next retry runs the action again, as a new attempt"
	case how.HTTP != nil:
		what := "its response, as a success (2xx, 3xx)"
		if how.HTTP.Status >= 400 {
			what = "its response, as a definitive failure (4xx)"
		}
		return fmt.Sprintf("every retry until the receipt expires gets HTTP %d %s with these headers and body: %s; nothing runs again",
			how.HTTP.Status, http.StatusText(how.HTTP.Status), what)
	case how.MCP != nil:
		if how.MCP.IsError {
			return "every retry until the receipt expires gets this tool result, as an error (a definitive failure); nothing runs again"
		}
		return "every retry until the receipt expires gets this tool result; nothing runs again"
	case how.State == receipts.Failed:
		return "every retry until the receipt expires gets this result as a definitive failure (ErrFailed); nothing runs again"
	}
	return "every retry until the receipt expires gets this result as a success; nothing runs again"
}
