package receiptconsole

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/receiptstore/receipts"
)

// The Settle page: an abandoned claim settled in its front end's form (Settle).

type settleData struct {
	Ref       string
	Row       keyRow
	Face      string // FaceHTTP, FaceMCP or ""
	FaceName  string
	Form      settleForm
	Outcomes  []outcomeOption
	Confirm   string // what the operator types to confirm: the ID as shown
	Gone      string // the claim is no longer abandoned: why there is no form
	CanSettle bool
}

type settleForm struct {
	Outcome, Status, Headers, Body, Result, Confirm string
}

type outcomeOption struct {
	Value, Label, RetryGets string
	Selected                bool
}

// outcomes are the ways a claim of face may be settled, in its form.
func outcomes(face, selected string) []outcomeOption {
	var o []outcomeOption
	switch face {
	case FaceHTTP:
		o = append(o, outcomeOption{Value: "http", Label: "It happened (or failed for good): record the HTTP response",
			RetryGets: "every retry until the receipt expires gets the response entered here (2xx or 3xx as a success, 4xx as a definitive failure); nothing runs again"})
	case FaceMCP:
		o = append(o, outcomeOption{Value: "mcp", Label: "It happened: record the tool result",
			RetryGets: "every retry until the receipt expires gets the tool result entered here (isError: true as a definitive failure); nothing runs again"})
	default:
		o = append(o,
			outcomeOption{Value: "succeeded", Label: "It happened: record a Succeeded receipt with the result",
				RetryGets: retryGets(Settlement{State: receipts.Succeeded}, "")},
			outcomeOption{Value: "failed", Label: "It failed for good: record a Failed receipt with the result",
				RetryGets: retryGets(Settlement{State: receipts.Failed}, "")})
	}
	o = append(o, outcomeOption{Value: "not_performed", Label: "It did not happen: forget the claim (NotPerformed)",
		RetryGets: retryGets(Settlement{NotPerformed: true}, "")})
	if selected == "" {
		selected = o[0].Value
	}
	for i := range o {
		o[i].Selected = o[i].Value == selected
	}
	return o
}

// settleView reads the claim of ref and fills the settle page's data; it returns a status
// and message when the page cannot be shown at all.
func (c *console) settleView(ctx context.Context, ref string, now time.Time, f settleForm) (*settleData, int, string) {
	k, err := c.unref(ref)
	if err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	rec, err := c.db.Inspect(ctx, k)
	if errors.Is(err, receipts.ErrNotFound) {
		return nil, http.StatusNotFound, "No claim of this key to settle: it was settled as not performed, or has expired."
	}
	if err != nil {
		return nil, http.StatusInternalServerError, err.Error()
	}
	d := &settleData{Ref: ref, Row: c.keyRow(rec, now), Face: FaceOf(rec), Form: f}
	d.FaceName = faceName(d.Face)
	d.Outcomes = outcomes(d.Face, f.Outcome)
	d.Confirm = showPart(rec.Key.ID)
	switch {
	case rec.State != receipts.Pending:
		d.Gone = fmt.Sprintf("This claim is already settled (%s): nothing to do.", rec.State)
	case !rec.Abandoned(now):
		d.Gone = fmt.Sprintf("Its holder's lease is live until %s: it is in progress, not abandoned.", when(rec.LeaseExpiresAt))
	case c.opts.ReadOnly:
		d.Gone = "The console is read-only: it settles nothing."
	default:
		d.CanSettle = true
	}
	if d.Form.Status == "" && d.Face == FaceHTTP {
		d.Form.Status = "200"
	}
	return d, 0, ""
}

func (c *console) settleForm(w http.ResponseWriter, r *http.Request) {
	now := c.now(r.Context())
	d, status, msg := c.settleView(r.Context(), r.URL.Query().Get("k"), now, settleForm{})
	if d == nil {
		c.fail(w, r, status, msg)
		return
	}
	c.render(w, r, http.StatusOK, "settle", view{Title: "Settle", Nav: "needs", Now: now, Data: d})
}

func (c *console) settlePost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	pf := r.PostForm
	f := settleForm{Outcome: pf.Get("outcome"), Status: pf.Get("status"), Headers: pf.Get("headers"),
		Body: pf.Get("body"), Result: pf.Get("result"), Confirm: pf.Get("confirm")}
	ref := pf.Get("k")
	d, status, msg := c.settleView(ctx, ref, now, f)
	if d == nil {
		c.fail(w, r, status, msg)
		return
	}
	again := func(status int, msg string) {
		c.render(w, r, status, "settle", view{Title: "Settle", Nav: "needs", Now: now, Error: msg + " Nothing changed.", Data: d})
	}
	if !d.CanSettle {
		again(http.StatusConflict, d.Gone)
		return
	}
	token, ok := formToken(pf)
	if !ok {
		again(http.StatusBadRequest, "The form's attempt token is not a number.")
		return
	}
	how, err := parseHow(d.Face, f)
	if err != nil {
		again(http.StatusBadRequest, sentence(err))
		return
	}
	if strings.TrimSpace(f.Confirm) != d.Confirm {
		d.Form.Confirm = ""
		again(http.StatusBadRequest, fmt.Sprintf("To confirm, type the key's ID exactly as shown (%s).", d.Confirm))
		return
	}
	k, _ := c.unref(ref) // settleView checked it
	out, err := Settle(ctx, c.db, k, token, how)
	if err != nil {
		again(settleStatus(err), err.Error())
		return
	}
	c.logChange(ctx, r, "receiptconsole: settled an abandoned claim", c.db.LogKey(k), "face", out.Face,
		"settled", out.Settled(), "attempt", out.Attempts, "token", out.Token)
	http.Redirect(w, r, "key?k="+c.ref(k)+"&done=settled", http.StatusSeeOther)
}

// parseHow reads the settle form into a Settlement, checking it against the claim's face.
func parseHow(face string, f settleForm) (Settlement, error) {
	valid := slices.ContainsFunc(outcomes(face, ""), func(o outcomeOption) bool { return o.Value == f.Outcome })
	if !valid {
		return Settlement{}, fmt.Errorf("%w: choose how it ended: %q is not one of this key's outcomes (a %s key)", ErrBadInput, f.Outcome, faceName(face))
	}
	switch f.Outcome {
	case "not_performed":
		return Settlement{NotPerformed: true}, nil
	case "succeeded":
		return Settlement{State: receipts.Succeeded, Result: []byte(f.Result)}, nil
	case "failed":
		return Settlement{State: receipts.Failed, Result: []byte(f.Result)}, nil
	case "mcp":
		res, err := ParseToolResult(f.Result)
		if err != nil {
			return Settlement{}, fmt.Errorf("the tool result: %w", err)
		}
		return Settlement{MCP: res}, nil
	}
	st, err := strconv.Atoi(strings.TrimSpace(f.Status))
	if err != nil {
		return Settlement{}, fmt.Errorf("%w: the HTTP status %q is not a number", ErrBadInput, f.Status)
	}
	var lines []string
	for line := range strings.Lines(f.Headers) {
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	h, err := ParseHeaders(lines)
	if err != nil {
		return Settlement{}, fmt.Errorf("the headers: %w", err)
	}
	resp, err := NewHTTPResponse(st, h, []byte(f.Body))
	switch {
	case errors.Is(err, ErrDeclined):
		return Settlement{}, fmt.Errorf("HTTP %d means the handler declined, which receipthttp does not store: if the action did not happen, choose \"It did not happen\": %w", st, err)
	case errors.Is(err, ErrNoOutcome):
		return Settlement{}, fmt.Errorf("HTTP %d is no outcome (receipthttp stores none for 5xx): settle with what happened at the provider: %w", st, err)
	case err != nil:
		return Settlement{}, fmt.Errorf("the response cannot be stored: %w", err)
	}
	return Settlement{HTTP: resp}, nil
}

// formToken reads a settle form's attempt token ("" is none, 0); false if it is not a number.
func formToken(pf url.Values) (uint64, bool) {
	s := pf.Get("token")
	if s == "" {
		return 0, true
	}
	token, err := strconv.ParseUint(s, 10, 64)
	return token, err == nil
}

// settleStatus is the HTTP status of a settle form whose settlement failed with err: 400
// for what cannot be stored (ErrBadInput), 503 once the store is closing, else 409 (the key
// moved on since the page was drawn).
func settleStatus(err error) int {
	switch {
	case errors.Is(err, ErrBadInput):
		return http.StatusBadRequest
	case errors.Is(err, receipts.ErrClosed):
		return http.StatusServiceUnavailable
	}
	return http.StatusConflict
}
