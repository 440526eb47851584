package receiptconsole

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The host half: the actions of a host's journal (Options.Journal) that need a person. An Uncertain action
// (its deadline came with no definitive answer) is redelivered under its own key, or
// settled with what the person found out; an Expired or Conflict action (answered, but not
// with an outcome) is forgotten once looked at.

// needsPerson are the states the Host half page lists, in its order.
var needsPerson = []string{"uncertain", "expired", "conflict"}

type actionRow struct {
	Ref                         string
	Key                         string
	Target, Operation, Approver string
	State                       string
	ApprovedAt, Deadline        time.Time
	UpdatedAt                   time.Time
	Attempts                    uint32
	LastError                   string
	UncertainStep               string
	Answer                      string
}

func (c *console) actionRow(a *Action) actionRow {
	return actionRow{Ref: c.seal([]byte(a.Key), "action"), Key: a.Key, Target: a.Target, Operation: a.Operation,
		Approver: a.ApprovedBy, State: a.State, ApprovedAt: a.ApprovedAt, Deadline: a.Deadline,
		UpdatedAt: a.UpdatedAt, Attempts: a.Attempts, LastError: a.LastError, UncertainStep: a.UncertainStep, Answer: a.Answer}
}

type actionsData struct {
	Groups    []actionGroup
	NoJournal bool
}

type actionGroup struct {
	State string
	Rows  []actionRow
	More  bool
}

func (c *console) actions(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	d := actionsData{NoJournal: c.opts.Journal == nil}
	v := view{Title: "Host half", Nav: "actions", Now: now, Data: &d}
	if r.URL.Query().Get("done") == "forgot" {
		v.Flash = "Forgotten: the action is no longer in the journal."
	}
	if c.opts.Journal != nil {
		for _, st := range needsPerson {
			g := actionGroup{State: st}
			for a, err := range c.opts.Journal.Actions(ctx, st) {
				if err != nil {
					c.fail(w, r, http.StatusInternalServerError, err.Error())
					return
				}
				if len(g.Rows) == c.opts.Limit {
					g.More = true
					break
				}
				g.Rows = append(g.Rows, c.actionRow(a))
			}
			d.Groups = append(d.Groups, g)
		}
	}
	c.render(w, r, http.StatusOK, "actions", v)
}

type actionData struct {
	Row         actionRow
	Uncertain   bool // redeliver or settle
	Answered    bool // forget
	CanChange   bool
	Op, Within  string // the form's values
	SettleState string
	Found       string
}

// action reads the action a link's reference names.
func (c *console) action(r *http.Request, ref string) (*Action, int, string) {
	if c.opts.Journal == nil {
		return nil, http.StatusNotFound, "The console was given no journal (Options.Journal): there is no host half to show."
	}
	key, ok := c.open(ref, "action")
	if !ok {
		return nil, http.StatusBadRequest, "The link's action reference is not valid here (made by another console, or before a restart): open the action from the Host half page."
	}
	a, err := c.opts.Journal.Action(r.Context(), string(key))
	switch {
	case errors.Is(err, ErrNoAction):
		return nil, http.StatusNotFound, "No such action: it was forgotten."
	case err != nil:
		return nil, http.StatusInternalServerError, err.Error()
	}
	return a, 0, ""
}

func (c *console) actionData(a *Action, f actionData) *actionData {
	d := &f
	d.Row = c.actionRow(a)
	d.Uncertain = a.State == "uncertain"
	d.Answered = a.State == "succeeded" || a.State == "failed" || a.State == "conflict" || a.State == "expired"
	d.CanChange = !c.opts.ReadOnly && (d.Uncertain || d.Answered)
	if d.Within == "" {
		d.Within = "1h"
	}
	if d.Op == "" {
		d.Op = "redeliver"
		if !d.Uncertain {
			d.Op = "forget"
		}
	}
	if d.SettleState == "" {
		d.SettleState = "succeeded"
	}
	return d
}

func (c *console) actionPage(w http.ResponseWriter, r *http.Request) {
	now := c.now(r.Context())
	a, status, msg := c.action(r, r.URL.Query().Get("a"))
	if a == nil {
		c.fail(w, r, status, msg)
		return
	}
	v := view{Title: "Action", Nav: "actions", Now: now, Data: c.actionData(a, actionData{})}
	switch r.URL.Query().Get("done") {
	case "redelivered":
		v.Flash = "Redelivered: the host's dispatcher sends it again under its own key until the new deadline; the service runs it if it never did, and answers from its receipt if it did."
	case "settled":
		v.Flash = "Settled: the action is answered with what you found; it is not delivered again."
	}
	c.render(w, r, http.StatusOK, "action", v)
}

func (c *console) actionPost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	pf := r.PostForm
	ref := pf.Get("a")
	a, status, msg := c.action(r, ref)
	if a == nil {
		c.fail(w, r, status, msg)
		return
	}
	d := c.actionData(a, actionData{Op: pf.Get("op"), Within: pf.Get("within"), SettleState: pf.Get("state"), Found: pf.Get("found")})
	again := func(status int, msg string) {
		c.render(w, r, status, "action", view{Title: "Action", Nav: "actions", Now: now, Error: msg + " Nothing changed.", Data: d})
	}
	if strings.TrimSpace(pf.Get("confirm")) != a.Key {
		again(http.StatusBadRequest, fmt.Sprintf("To confirm, type the action's key exactly (%s).", a.Key))
		return
	}
	j := c.opts.Journal
	var err error
	var done string
	switch d.Op {
	case "redeliver":
		within, perr := time.ParseDuration(strings.TrimSpace(d.Within))
		if perr != nil || within <= 0 {
			again(http.StatusBadRequest, fmt.Sprintf("Deliver for how long: %q is not a positive duration (1h, 30m).", d.Within))
			return
		}
		err = j.Redeliver(ctx, a.Key, within)
		done = "redelivered"
	case "settle":
		if d.SettleState != "succeeded" && d.SettleState != "failed" {
			again(http.StatusBadRequest, "Settle it as succeeded or failed.")
			return
		}
		err = j.Settle(ctx, a.Key, d.SettleState == "succeeded", c.operator(r), []byte(d.Found))
		done = "settled"
	case "forget":
		err = j.Forget(ctx, a.Key)
		done = "forgot"
	default:
		again(http.StatusBadRequest, fmt.Sprintf("No such change %q (redeliver, settle or forget).", d.Op))
		return
	}
	switch {
	case errors.Is(err, ErrActionState):
		again(http.StatusConflict, fmt.Sprintf("The action is %s now: it cannot be %s.", a.State, map[string]string{"redelivered": "redelivered (uncertain actions only)", "settled": "settled (uncertain actions only)", "forgot": "forgotten (answered actions only)"}[done]))
		return
	case errors.Is(err, ErrBadInput):
		again(http.StatusBadRequest, sentence(err))
		return
	case err != nil:
		again(http.StatusInternalServerError, err.Error())
		return
	}
	c.logChange(ctx, r, "receiptconsole: "+done+" an action", "action", a.Key, "target", a.Target, "operation", a.Operation, "was", a.State)
	if done == "forgot" {
		http.Redirect(w, r, "actions?done=forgot", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "action?a="+c.seal([]byte(a.Key), "action")+"&done="+done, http.StatusSeeOther)
}
