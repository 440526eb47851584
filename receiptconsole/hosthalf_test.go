package receiptconsole_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/receiptstore/receipts/receiptconsole/consoleintents"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// transportFunc is a Transport from a func: the service side of the host's deliveries.
type transportFunc func(ctx context.Context, a *intents.Action) (*intents.Answer, error)

func (f transportFunc) Deliver(ctx context.Context, a *intents.Action) (*intents.Answer, error) {
	return f(ctx, a)
}

// hostJournal makes a journal with two uncertain actions (their deadline passed with no
// answer from "billing") and one expired one ("archive" answered 410: the key outlived the
// service's retention).
func hostJournal(t *testing.T) (j *intents.Journal, uncertain []string, expired string) {
	t.Helper()
	clock := receiptstest.NewClock(time.Now())
	j, err := intents.Open(t.TempDir(), &intents.Options{Now: clock.Now, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, j.Close()) })
	for _, ref := range []string{"call-1", "call-2"} {
		a, err := j.Approve(bg, intents.Approval{Target: "billing", Operation: "POST /v1/refunds", Arguments: map[string]int{"amount": 5},
			ApprovedBy: "ana", Ref: ref, Deadline: clock.Now().Add(time.Minute)})
		require.NoError(t, err)
		uncertain = append(uncertain, a.Key)
	}
	clock.Advance(2 * time.Minute)
	a, err := j.Approve(bg, intents.Approval{Target: "archive", Operation: "POST /v1/exports", ApprovedBy: "ana", Deadline: clock.Now().Add(time.Hour)})
	require.NoError(t, err)
	expired = a.Key
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{Logger: quiet, Transports: map[string]intents.Transport{
		"billing": transportFunc(func(context.Context, *intents.Action) (*intents.Answer, error) {
			return nil, errors.New("billing timed out")
		}),
		"archive": transportFunc(func(context.Context, *intents.Action) (*intents.Answer, error) {
			return &intents.Answer{State: intents.Expired, Status: http.StatusGone}, nil
		}),
	}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	for _, k := range append(append([]string{}, uncertain...), expired) {
		_, err := j.Wait(ctx, k)
		require.NoError(t, err)
	}
	require.NoError(t, d.Close())
	return j, uncertain, expired
}

// The Host half page lists the journal's uncertain and expired actions; an uncertain one
// is redelivered under its key or settled with what the person found, an expired one
// forgotten, each after its key is typed, and logged with who did it; a wrong confirmation
// changes nothing.
func TestHostHalf(t *testing.T) {
	db := openPebble(t, nil)
	j, uncertain, expired := hostJournal(t)
	var log bytes.Buffer
	cs := serveConsole(t, db, &receiptconsole.Options{Journal: consoleintents.Journal(j), Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Operator: func(*http.Request) string { return "oscar" }})
	require.Contains(t, text(cs.get(t, "").doc), "2 uncertain actions in the host's journal")
	list := cs.get(t, "actions")
	require.Equal(t, http.StatusOK, list.status, list.body)
	checkPage(t, list, false)
	for _, k := range append(uncertain, expired) {
		require.Contains(t, list.body, k)
	}
	require.Contains(t, text(list.doc), "without an answer")
	opens := list.links("Open")
	require.Len(t, opens, 3)
	for _, href := range opens {
		require.NotContains(t, href, uncertain[0])
		checkPage(t, cs.get(t, href), false)
	}

	// The first uncertain action: a wrong confirmation, then a redelivery for an hour.
	form := cs.get(t, list.rowLink(t, uncertain[0], "Open")).form(t, "action")
	require.Equal(t, "redeliver", form.Get("op"))
	form.Set("confirm", uncertain[1])
	p := cs.post(t, "action", form, nil)
	require.Equal(t, http.StatusBadRequest, p.status)
	require.Contains(t, text(p.doc), "Nothing changed")
	form.Set("within", "-5m")
	form.Set("confirm", uncertain[0])
	require.Equal(t, http.StatusBadRequest, cs.post(t, "action", form, nil).status)
	a, err := j.Get(bg, uncertain[0])
	require.NoError(t, err)
	require.Equal(t, intents.Uncertain, a.State)
	form.Set("within", "1h")
	p = cs.post(t, "action", form, nil)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	require.Contains(t, text(cs.get(t, p.header.Get("Location")).doc), "Redelivered")
	a, err = j.Get(bg, uncertain[0])
	require.NoError(t, err)
	require.Equal(t, intents.Approved, a.State)

	// The second: settled as succeeded, with what the person found.
	form = cs.get(t, list.rowLink(t, uncertain[1], "Open")).form(t, "action")
	form.Set("op", "settle")
	form.Set("state", "succeeded")
	form.Set("found", "refund re_42 at the provider")
	form.Set("confirm", uncertain[1])
	p = cs.post(t, "action", form, nil)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	a, err = j.Get(bg, uncertain[1])
	require.NoError(t, err)
	require.Equal(t, intents.Succeeded, a.State)
	require.Equal(t, "oscar", a.Answer.SettledBy)
	require.Equal(t, "refund re_42 at the provider", string(a.Answer.Body))

	// The expired one: forgotten.
	form = cs.get(t, list.rowLink(t, expired, "Open")).form(t, "action")
	require.Equal(t, "forget", form.Get("op"))
	form.Set("confirm", expired)
	p = cs.post(t, "action", form, nil)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	require.Contains(t, text(cs.get(t, p.header.Get("Location")).doc), "Forgotten")
	_, err = j.Get(bg, expired)
	require.ErrorIs(t, err, intents.ErrNotFound)
	require.Contains(t, log.String(), "operator=oscar")
	require.Contains(t, log.String(), "redelivered an action")
	require.Contains(t, log.String(), "forgot an action")

	// Read-only: no form, and the POST is refused.
	ro := serveConsole(t, db, &receiptconsole.Options{Journal: consoleintents.Journal(j), ReadOnly: true, Logger: quiet})
	checkPage(t, ro.get(t, "actions"), true)

	// Without a journal the page says so.
	none := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
	require.Contains(t, text(none.get(t, "actions").doc), "no host journal")
}

// An uncertain action whose service named the step of its action that was uncertain shows
// that step on its page.
func TestHostHalfUncertainStep(t *testing.T) {
	db := openPebble(t, nil)
	j, err := intents.Open(t.TempDir(), &intents.Options{Logger: quiet, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, j.Close()) })
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{Logger: quiet, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Transports: map[string]intents.Transport{"billing": transportFunc(func(context.Context, *intents.Action) (*intents.Answer, error) {
			return nil, &intents.StepError{Step: "reverse-charge", Err: errors.New("billing: outcome unknown")}
		})}})
	require.NoError(t, err)
	a, err := j.Approve(bg, intents.Approval{Target: "billing", Operation: "POST /v1/refunds", ApprovedBy: "ana", Deadline: time.Now().Add(200 * time.Millisecond)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	got, err := j.Wait(ctx, a.Key)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.Equal(t, intents.Uncertain, got.State)
	require.Equal(t, "reverse-charge", got.UncertainStep)
	cs := serveConsole(t, db, &receiptconsole.Options{Journal: consoleintents.Journal(j), Logger: quiet})
	p := cs.get(t, cs.get(t, "actions").rowLink(t, a.Key, "Open"))
	checkPage(t, p, false)
	require.Contains(t, text(p.doc), "Uncertain stepreverse-charge: the service reported this step of its action uncertain")
}
