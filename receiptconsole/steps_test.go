package receiptconsole_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"
)

// trip is a three-step action (reserve, charge, notify) that counts its steps' runs and
// fails with an unknown outcome in the step named fail ("" for none).
type trip struct {
	runs      map[string]int
	recovered map[string]bool
	fail      string
}

func newTrip(fail string) *trip {
	return &trip{runs: map[string]int{}, recovered: map[string]bool{}, fail: fail}
}

func (a *trip) fn(ctx context.Context, l *receipts.Lease) ([]byte, error) {
	var out []string
	for _, name := range []string{"reserve", "charge", "notify"} {
		res, err := l.Step(ctx, name, []byte("args-"+name), func(_ context.Context, s *receipts.Step) ([]byte, error) {
			a.runs[name]++
			a.recovered[name] = s.Recovered()
			if a.fail == name {
				return nil, errors.New("connection reset: outcome unknown")
			}
			return []byte(name + "-done"), nil
		})
		if err != nil {
			return nil, err
		}
		out = append(out, string(res))
	}
	return []byte(strings.Join(out, ",")), nil
}

var tripFP = []byte("fp-trip")

// abandonTrip makes an abandoned claim of k whose step "charge" is uncertain.
func abandonTrip(t *testing.T, db *receipts.DB, k receipts.Key) {
	t.Helper()
	_, err := db.Do(bg, k, tripFP, newTrip("charge").fn)
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
}

// stepsTable returns the rows of p's step journal table, each a row's cells' text.
func stepsTable(p *page) [][]string {
	var rows [][]string
	walk(p.doc, func(n *html.Node) {
		if n.Data != "table" || !strings.Contains(attr(n, "class"), "steps") {
			return
		}
		walk(n, func(tr *html.Node) {
			if tr.Data != "tr" {
				return
			}
			var cells []string
			walk(tr, func(td *html.Node) {
				if td.Data == "td" {
					cells = append(cells, text(td))
				}
			})
			if cells != nil {
				rows = append(rows, cells)
			}
		})
	})
	return rows
}

// The key page shows a claim's step journal with the uncertain step marked, and the Settle
// step page settles it (CSRF, typed confirmation, logged with the operator's name): done,
// the next retry gets the operator's result for the step and runs only the steps after it;
// not done, it runs the step again as never started.
func TestSettleStep(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			db := e.open(t, nil)
			fixture(t, db)
			done, notDone := receipts.Key{Scope: "dave", ID: "trip-1"}, receipts.Key{Scope: "dave", ID: "trip-2"}
			abandonTrip(t, db, done)
			abandonTrip(t, db, notDone)
			var log bytes.Buffer
			cs := serveConsole(t, db, &receiptconsole.Options{Logger: slog.New(slog.NewTextHandler(&log, nil)),
				Operator:   func(*http.Request) string { return "oscar" },
				ShowResult: func(*http.Request, *receipts.Receipt) error { return nil }})
			steps, err := db.Steps(bg, done)
			require.NoError(t, err)
			require.Len(t, steps, 2)

			// The key page: the journal, the uncertain step, what a retry gets, the link.
			kp := cs.get(t, "key?"+url.Values{"scope": {"dave"}, "id": {"trip-1"}}.Encode())
			require.Equal(t, http.StatusOK, kp.status)
			checkPage(t, kp, false)
			rows := stepsTable(kp)
			require.Len(t, rows, 2)
			require.Equal(t, []string{"0", "reserve", "succeeded", steps[0].ProviderKey}, rows[0][:4])
			require.Equal(t, "12 B reserve-done", rows[0][5])
			require.Equal(t, []string{"1", "charge", "Uncertain: started, outcome unknown", steps[1].ProviderKey}, rows[1][:4])
			require.Equal(t, "-", rows[1][5])
			body := text(kp.doc)
			require.Contains(t, body, "Step 1 charge is uncertain")
			require.Contains(t, body, `the outcome of step 1 "charge" is unknown: the next retry takes the claim over and resumes the action`)
			stepLinks := kp.links("Settle step charge")
			require.Len(t, stepLinks, 1)
			require.NotContains(t, stepLinks[0], "trip-1", "the link names no key")

			// Needs a person: the trip's row names its uncertain step and that step's provider
			// key (the one to ask the provider about), with a link to settle that step; a claim
			// without steps names none.
			np := cs.get(t, "needs")
			require.Equal(t, http.StatusOK, np.status)
			checkPage(t, np, false)
			require.Contains(t, np.rowText(t, "trip-1"), "uncertain: step 1 charge, provider key "+steps[1].ProviderKey)
			require.Contains(t, np.rowText(t, "trip-1"), db.ProviderKey(done), "the action's own provider key stays")
			require.NotContains(t, np.rowText(t, "op-http"), "uncertain")
			sl := np.rowLink(t, "trip-1", "Settle step")
			require.NotContains(t, sl, "trip-1", "the link names no key")
			require.Equal(t, "charge", cs.get(t, sl).form(t, "step").Get("step"))

			// A key without steps shows no journal; a live claim's journal has no uncertain step.
			kp2 := cs.get(t, "key?"+url.Values{"scope": {"bob"}, "id": {"op-lib"}}.Encode())
			require.Empty(t, stepsTable(kp2))
			require.Empty(t, kp2.links("Settle step charge"))

			// The Settle step page: refusals change nothing.
			sp := cs.get(t, stepLinks[0])
			require.Equal(t, http.StatusOK, sp.status, sp.body)
			checkPage(t, sp, false)
			require.Contains(t, text(sp.doc), steps[1].ProviderKey)
			form := sp.form(t, "step")
			require.Equal(t, "done", form.Get("outcome"))
			require.Equal(t, "charge", form.Get("step"))
			before := abandoned(t, db)
			for _, c := range []struct {
				set    map[string]string
				status int
				want   string
			}{
				{map[string]string{"confirm": "trip-1"}, http.StatusBadRequest, "type the step's name exactly"},
				{map[string]string{"confirm": "charge", "outcome": "succeeded"}, http.StatusBadRequest, "not one of its outcomes"},
				{map[string]string{"confirm": "charge", "step": "reserve"}, http.StatusConflict, "the uncertain step is now 1"},
				{map[string]string{"confirm": "charge", "token": "999999"}, http.StatusConflict, "is gone"},
				{map[string]string{"confirm": "charge", "csrf": "forged"}, http.StatusForbidden, "token does not match"},
			} {
				f := url.Values{}
				for k, v := range form {
					f[k] = v
				}
				for k, v := range c.set {
					f.Set(k, v)
				}
				p := cs.post(t, "step", f, nil)
				require.Equal(t, c.status, p.status, "%v: %s", c.set, p.body)
				require.Contains(t, text(p.doc), c.want, c.set)
				require.Contains(t, text(p.doc), "othing changed", c.set)
				require.Equal(t, before, abandoned(t, db), "%v changed something", c.set)
				got, err := db.Steps(bg, done)
				require.NoError(t, err)
				require.Equal(t, receipts.Pending, got[1].State, "%v settled the step", c.set)
			}

			// The whole claim cannot be forgotten: its step "reserve" happened.
			sf := cs.get(t, "settle?k="+kp.rowRef(t)).form(t, "settle")
			sf.Set("outcome", "not_performed")
			sf.Set("confirm", "trip-1")
			p := cs.post(t, "settle", sf, nil)
			require.Equal(t, http.StatusConflict, p.status, p.body)
			require.Contains(t, text(p.doc), `its action recorded 0 "reserve" (succeeded), which happened`)
			require.Equal(t, before, abandoned(t, db))

			// Done, with a result.
			form.Set("result", "ch_42")
			form.Set("confirm", "charge")
			p = cs.post(t, "step", form, nil)
			require.Equal(t, http.StatusSeeOther, p.status, p.body)
			require.NotContains(t, p.header.Get("Location"), "trip-1", "the redirect names no key")
			kp = cs.get(t, p.header.Get("Location"))
			require.Contains(t, text(kp.doc), "Step settled")
			rows = stepsTable(kp)
			require.Equal(t, []string{"1", "charge", "succeeded"}, rows[1][:3])
			require.Equal(t, "5 B ch_42", rows[1][5])
			require.Contains(t, log.String(), "settled an uncertain step")
			require.Contains(t, log.String(), "operator=oscar")
			require.Contains(t, log.String(), "settled=done")
			require.NotContains(t, log.String(), "trip-1", "the log names keys by their hash")
			require.Contains(t, abandoned(t, db), done.String(), "abandoned again: the next retry resumes")

			// The same form again: no step is uncertain now.
			p = cs.post(t, "step", form, nil)
			require.Equal(t, http.StatusConflict, p.status)
			require.Contains(t, text(p.doc), "No step of this claim has an unknown outcome")

			a := newTrip("")
			r, err := db.Do(bg, done, tripFP, a.fn)
			require.NoError(t, err)
			require.Equal(t, "reserve-done,ch_42,notify-done", string(r.Result))
			require.Equal(t, map[string]int{"notify": 1}, a.runs, "the retry resumed after the settled step")

			// Not done: the retry runs the step again, as never started.
			f := cs.get(t, cs.get(t, "key?"+url.Values{"scope": {"dave"}, "id": {"trip-2"}}.Encode()).links("Settle step charge")[0]).form(t, "step")
			f.Set("outcome", "not_done")
			f.Set("confirm", "charge")
			p = cs.post(t, "step", f, nil)
			require.Equal(t, http.StatusSeeOther, p.status, p.body)
			require.Contains(t, log.String(), "settled=not_done")
			a = newTrip("")
			r, err = db.Do(bg, notDone, tripFP, a.fn)
			require.NoError(t, err)
			require.Equal(t, "reserve-done,charge-done,notify-done", string(r.Result))
			require.Equal(t, map[string]int{"charge": 1, "notify": 1}, a.runs)
			require.False(t, a.recovered["charge"])
		})
	}
}

// Read-only, the journal is shown and the uncertain step marked, with no way to settle it;
// without ShowResult, step results are hidden (their sizes shown).
func TestStepsReadOnly(t *testing.T) {
	db := openPebble(t, nil)
	k := receipts.Key{Scope: "dave", ID: "trip-1"}
	abandonTrip(t, db, k)
	cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet, ReadOnly: true})
	kp := cs.get(t, "key?"+url.Values{"scope": {"dave"}, "id": {"trip-1"}}.Encode())
	checkPage(t, kp, true)
	rows := stepsTable(kp)
	require.Len(t, rows, 2)
	require.Equal(t, "12 B", rows[0][5], "results hidden without ShowResult")
	require.Contains(t, rows[1][2], "Uncertain")
	require.Empty(t, kp.links("Settle step charge"))
}

// rowRef returns the key reference of p's "Settle this claim" link.
func (p *page) rowRef(t *testing.T) string {
	t.Helper()
	links := p.links("Settle this claim")
	require.Len(t, links, 1, p.body)
	u, err := url.Parse(links[0])
	require.NoError(t, err)
	return url.QueryEscape(u.Query().Get("k"))
}
