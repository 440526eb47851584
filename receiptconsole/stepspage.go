package receiptconsole

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
)

// A key's step journal on the One key page, and the Settle step page: the uncertain step
// of an abandoned claim settled as done, failed or not done (SettleStep).

// stepRow is one step of a key's journal as the pages show it.
type stepRow struct {
	Index       int
	Name        string // as shown
	State       string
	Uncertain   bool // pending on an abandoned claim: the outcome is unknown
	Running     bool // pending on a live claim
	ProviderKey string
	At          time.Time
	Size        int    // the result's size in bytes (-1 while pending)
	Result      string // its preview, when results may be shown
}

// stepPreview is how many characters of a step's result the journal shows.
const stepPreview = 80

// stepRows reads k's step journal for rec's page; show says whether results may be shown.
func (c *console) stepRows(ctx context.Context, rec *receipts.Receipt, now time.Time, show bool) ([]stepRow, *stepRow, error) {
	steps, err := c.db.Steps(ctx, rec.Key)
	if err != nil {
		return nil, nil, err
	}
	abandoned := rec.State == receipts.Pending && rec.Abandoned(now)
	rows := make([]stepRow, len(steps))
	var uncertain *stepRow
	for i, s := range steps {
		row := stepRow{Index: s.Index, Name: showPart(s.Name), State: s.State.String(), ProviderKey: s.ProviderKey, At: s.At, Size: -1}
		if s.State == receipts.Pending {
			row.Uncertain, row.Running = abandoned, !abandoned && rec.State == receipts.Pending
		} else {
			row.Size = len(s.Result)
			if show {
				row.Result = preview(bodyText(s.Result), stepPreview)
			}
		}
		rows[i] = row
		if row.Uncertain {
			uncertain = &rows[i]
		}
	}
	return rows, uncertain, nil
}

// preview cuts s to at most n characters, on one line.
func preview(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}

// resumeGets says what the next retry of a claim whose step u is uncertain gets.
func resumeGets(u *stepRow) string {
	return fmt.Sprintf("the outcome of step %d %s is unknown: the next retry takes the claim over and resumes the action; the steps recorded before it are not run again, and step %d runs again, Recovered, with its provider key %s (it must check with the provider before acting), unless the step is settled first",
		u.Index, strconv.Quote(u.Name), u.Index, u.ProviderKey)
}

type stepData struct {
	Ref       string
	Row       keyRow
	Steps     []stepRow
	Step      *stepRow // the uncertain step
	StepName  string   // its name as stored (the form's hidden field)
	Form      stepForm
	Outcomes  []outcomeOption
	Confirm   string // what the operator types to confirm: the step's name as shown
	Gone      string // no step to settle: why there is no form
	CanSettle bool
}

type stepForm struct {
	Outcome, Result, Confirm string
}

// stepOutcomes are the ways an uncertain step may be settled.
func stepOutcomes(selected string) []outcomeOption {
	o := []outcomeOption{
		{Value: "done", Label: "It happened: record the step as done, with the result",
			RetryGets: retryGetsStep(StepSettlement{State: receipts.Succeeded})},
		{Value: "failed", Label: "It failed for good: record the step as failed, with the result",
			RetryGets: retryGetsStep(StepSettlement{State: receipts.Failed})},
		{Value: "not_done", Label: "It did not happen: take the step's start back (not done)",
			RetryGets: retryGetsStep(StepSettlement{State: receipts.Pending})},
	}
	if selected == "" {
		selected = o[0].Value
	}
	for i := range o {
		o[i].Selected = o[i].Value == selected
	}
	return o
}

// stepView reads the claim of ref and its journal and fills the Settle step page's data;
// it returns a status and message when the page cannot be shown at all.
func (c *console) stepView(r *http.Request, ref string, now time.Time, f stepForm) (*stepData, int, string) {
	ctx := r.Context()
	k, err := c.unref(ref)
	if err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	rec, err := c.db.Inspect(ctx, k)
	if errors.Is(err, receipts.ErrNotFound) {
		return nil, http.StatusNotFound, "No claim of this key: it was settled as not performed, or has expired."
	}
	if err != nil {
		return nil, http.StatusInternalServerError, err.Error()
	}
	d := &stepData{Ref: ref, Row: c.keyRow(rec, now), Form: f, Outcomes: stepOutcomes(f.Outcome)}
	d.Steps, d.Step, err = c.stepRows(ctx, rec, now, c.mayShow(r, rec))
	if err != nil {
		return nil, http.StatusInternalServerError, err.Error()
	}
	switch {
	case rec.State != receipts.Pending:
		d.Gone = fmt.Sprintf("This claim is settled (%s): no step to settle.", rec.State)
	case !rec.Abandoned(now):
		d.Gone = fmt.Sprintf("Its holder's lease is live until %s: its steps are running, not uncertain.", when(rec.LeaseExpiresAt))
	case d.Step == nil:
		d.Gone = "No step of this claim has an unknown outcome: settle the whole claim instead."
	case c.opts.ReadOnly:
		d.Gone = "The console is read-only: it settles nothing."
	default:
		d.CanSettle = true
		d.Confirm = d.Step.Name
	}
	return d, 0, ""
}

// mayShow reports whether rec's results may be shown to r's operator (Options.ShowResult).
func (c *console) mayShow(r *http.Request, rec *receipts.Receipt) bool {
	return c.opts.ShowResult != nil && c.opts.ShowResult(r, rec) == nil
}

func (c *console) stepPage(w http.ResponseWriter, r *http.Request) {
	now := c.now(r.Context())
	d, status, msg := c.stepView(r, r.URL.Query().Get("k"), now, stepForm{})
	if d == nil {
		c.fail(w, r, status, msg)
		return
	}
	c.render(w, r, http.StatusOK, "step", view{Title: "Settle a step", Nav: "needs", Now: now, Data: d})
}

func (c *console) stepPost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	pf := r.PostForm
	f := stepForm{Outcome: pf.Get("outcome"), Result: pf.Get("result"), Confirm: pf.Get("confirm")}
	ref := pf.Get("k")
	d, status, msg := c.stepView(r, ref, now, f)
	if d == nil {
		c.fail(w, r, status, msg)
		return
	}
	again := func(status int, msg string) {
		c.render(w, r, status, "step", view{Title: "Settle a step", Nav: "needs", Now: now, Error: msg + " Nothing changed.", Data: d})
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
	name := typedPart(pf.Get("step"))
	if showPart(name) != d.Step.Name {
		again(http.StatusConflict, fmt.Sprintf("The form settles step %s, but the uncertain step is now %d %s: reload the page.", strconv.Quote(name), d.Step.Index, strconv.Quote(d.Step.Name)))
		return
	}
	if !slices.ContainsFunc(d.Outcomes, func(o outcomeOption) bool { return o.Value == f.Outcome }) {
		again(http.StatusBadRequest, fmt.Sprintf("Choose how the step ended: %q is not one of its outcomes.", f.Outcome))
		return
	}
	how := StepSettlement{State: receipts.Pending}
	switch f.Outcome {
	case "done":
		how = StepSettlement{State: receipts.Succeeded, Result: []byte(f.Result)}
	case "failed":
		how = StepSettlement{State: receipts.Failed, Result: []byte(f.Result)}
	}
	if strings.TrimSpace(f.Confirm) != d.Confirm {
		d.Form.Confirm = ""
		again(http.StatusBadRequest, fmt.Sprintf("To confirm, type the step's name exactly as shown (%s).", d.Confirm))
		return
	}
	k, _ := c.unref(ref) // stepView checked it
	out, err := SettleStep(ctx, c.db, k, token, name, how)
	if err != nil {
		again(settleStatus(err), err.Error())
		return
	}
	c.logChange(ctx, r, "receiptconsole: settled an uncertain step", c.db.LogKey(k), "step", out.Index,
		"settled", out.Settled, "attempt", out.Attempts, "token", out.Token)
	http.Redirect(w, r, "key?k="+c.ref(k)+"&done=step", http.StatusSeeOther)
}
