package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/receiptadmin"
)

// trip is a three-step action (reserve, charge, notify) whose steps count their runs and
// fail with an unknown outcome in the step named by fail ("" for none).
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

// fillSteps writes the keys of the steps tests:
//
//	acct_3/trip-done     abandoned in its step "charge" (uncertain): settled as done
//	acct_3/trip-not      abandoned in its step "charge" (uncertain): settled as not done
//	acct_3/trip-live     its step "reserve" recorded, its lease live (30s)
func fillSteps(t *testing.T, db *receipts.DB) {
	t.Helper()
	ctx := context.Background()
	for _, id := range []string{"trip-done", "trip-not"} {
		_, err := db.Do(ctx, receipts.Key{Scope: "acct_3", ID: id}, fp, newTrip("charge").fn)
		require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	}
	l, _, err := db.Claim(ctx, receipts.Key{Scope: "acct_3", ID: "trip-live"}, fp)
	require.NoError(t, err)
	_, err = l.Step(ctx, "reserve", []byte("args-reserve"), func(context.Context, *receipts.Step) ([]byte, error) {
		return []byte("reserve-done"), nil
	})
	require.NoError(t, err)
}

// getJSON runs get --json on store.
func getJSON(t *testing.T, store []string, scope, id string) receiptadmin.Receipt {
	t.Helper()
	r := cli(t, pgArgs(store, "get", scope, id, "--json")...).requireCode(t, exitOK)
	var a receiptadmin.Receipt
	require.NoError(t, json.Unmarshal([]byte(r.out), &a), r.out)
	return a
}

// testSteps: get shows the step journal and marks the uncertain step; reconcile lists it,
// refuses what must be refused with nothing written, and settles one step as done and
// another as not done, after which a retry (resume) resumes each action where it was cut.
func testSteps(t *testing.T, store []string, resume func(t *testing.T, id string, a *trip) []byte) {
	// get, text: the journal, the uncertain step, what to do.
	r := cli(t, pgArgs(store, "get", "acct_3", "trip-done")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "state          pending (abandoned")
	require.Regexp(t, `(?m)^steps\s+2$`, r.out)
	require.Regexp(t, `(?m)^\s+#\s+NAME\s+STATE\s+PROVIDER KEY\s+AT\s+RESULT$`, r.out)
	require.Regexp(t, `(?m)^\s+0\s+reserve\s+succeeded\s+rk_[A-Za-z0-9_-]{43}\s+\S+ \S+\s+12 B reserve-done$`, r.out)
	require.Regexp(t, `(?m)^\s+1\s+charge\s+UNCERTAIN \(started, outcome unknown\)\s+rk_[A-Za-z0-9_-]{43}\s+\S+ \S+\s+-$`, r.out)
	require.Contains(t, r.out, `uncertain      step 1 "charge" started and its holder is gone`)
	require.Contains(t, r.out, "receiptctl reconcile acct_3 trip-done --step charge --done [--result RESULT]")
	require.Contains(t, r.out, "receiptctl reconcile acct_3 trip-done --step charge --not-done")

	// get --json: the same, marked.
	a := getJSON(t, store, "acct_3", "trip-done")
	require.True(t, a.Abandoned)
	require.Len(t, a.Steps, 2)
	require.Equal(t, receiptadmin.Step{Index: 0, Name: "reserve", State: "succeeded", Fingerprint: "617267732d72657365727665",
		Result: []byte("reserve-done"), At: a.Steps[0].At, ProviderKey: a.Steps[0].ProviderKey}, a.Steps[0])
	require.Equal(t, "charge", a.Steps[1].Name)
	require.Equal(t, "pending", a.Steps[1].State)
	require.True(t, a.Steps[1].Uncertain)
	require.Nil(t, a.Steps[1].Result)
	require.NotEqual(t, a.Steps[0].ProviderKey, a.Steps[1].ProviderKey)
	require.Contains(t, r.out, a.Steps[1].ProviderKey)
	require.Equal(t, &a.Steps[1], a.UncertainStep())

	// A live claim's steps are running, not uncertain; a key without steps shows none.
	r = cli(t, pgArgs(store, "get", "acct_3", "trip-live")...).requireCode(t, exitOK)
	require.Regexp(t, `(?m)^\s+0\s+reserve\s+succeeded\s`, r.out)
	require.NotContains(t, r.out, "UNCERTAIN")
	require.NotContains(t, r.out, "uncertain")
	live := getJSON(t, store, "acct_3", "trip-live")
	require.Nil(t, live.UncertainStep())
	r = cli(t, pgArgs(store, "get", "acct_2", "op-lost", "--json")...).requireCode(t, exitOK)
	require.NotContains(t, r.out, `"steps"`)

	// reconcile lists the uncertain step of each abandoned claim.
	rows := reconcileRows(t, store)
	byID := map[string]reconcileRow{}
	for _, row := range rows {
		byID[row.ID] = row
	}
	require.Nil(t, byID["op-lost"].Step, "a claim without steps")
	require.Equal(t, &reconcileStep{Index: 1, Name: "charge", ProviderKey: a.Steps[1].ProviderKey}, byID["trip-done"].Step)
	require.Equal(t, "charge", byID["trip-not"].Step.Name)
	table := cli(t, pgArgs(store, "reconcile")...).requireCode(t, exitOK)
	require.Regexp(t, `(?m)^SCOPE\s+ID\s+ATTEMPTS\s+TOKEN\s+LEASE ENDED\s+PROVIDER KEY\s+FACE\s+STEP$`, table.out)
	require.Regexp(t, `(?m)^acct_3\s+trip-done\s.*\s1 charge \(uncertain\)$`, table.out)
	require.Regexp(t, `(?m)^acct_2\s+op-lost\s.*\s-$`, table.out)

	// Refused, nothing written.
	usage := [][]string{
		{"reconcile", "acct_3", "trip-done", "--step", "charge"},
		{"reconcile", "acct_3", "trip-done", "--step", "charge", "--done", "--not-done"},
		{"reconcile", "acct_3", "trip-done", "--step", "charge", "--done", "--commit", "x"},
		{"reconcile", "acct_3", "trip-done", "--step", "charge", "--not-done", "--result", "x"},
		{"reconcile", "acct_3", "trip-done", "--done"},
		{"reconcile", "--step", "charge", "--done"},
	}
	for _, args := range usage {
		cli(t, pgArgs(store, args...)...).requireCode(t, exitUsage)
	}
	tok := strconv.FormatUint(byID["trip-done"].Token, 10)
	r = cli(t, pgArgs(store, "reconcile", "acct_3", "trip-done", "--step", "reserve", "--done")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, `step "reserve" is not the uncertain one: step 1 "charge" is`)
	r = cli(t, pgArgs(store, "reconcile", "acct_3", "trip-done", "--token", strconv.FormatUint(byID["trip-done"].Token+1000, 10), "--step", "charge", "--done")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "is gone")
	r = cli(t, pgArgs(store, "reconcile", "acct_3", "trip-live", "--step", "reserve", "--done")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "lease is live")
	r = cli(t, pgArgs(store, "reconcile", "acct_2", "op-lost", "--step", "charge", "--done")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "has no steps")
	r = cli(t, pgArgs(store, "reconcile", "acct_1", "op-ok", "--step", "charge", "--done")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "already settled")
	// The whole claim as not performed would forget its recorded step "reserve", and the
	// next call would run it again.
	r = cli(t, pgArgs(store, "reconcile", "acct_3", "trip-done", "--not-performed")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, `its action recorded 0 "reserve" (succeeded), which happened`)
	require.Equal(t, rows, reconcileRows(t, store), "nothing written by the refused ones")

	// Settled as done: the claim is abandoned again, the step recorded with its result.
	r = cli(t, pgArgs(store, "reconcile", "acct_3", "trip-done", "--token", tok, "--step", "charge", "--done", "--result", "ch_1", "--json")...).requireCode(t, exitOK)
	var res stepResult
	require.NoError(t, json.Unmarshal([]byte(r.out), &res), r.out)
	require.Equal(t, stepResult{Scope: "acct_3", ID: "trip-done", Step: "charge", Index: 1, ProviderKey: a.Steps[1].ProviderKey,
		Settled: "done", Attempts: 2, Token: res.Token}, res)
	require.Greater(t, res.Token, byID["trip-done"].Token)
	a = getJSON(t, store, "acct_3", "trip-done")
	require.Equal(t, "pending", a.State)
	require.True(t, a.Abandoned, "abandoned again: the next retry resumes")
	require.Len(t, a.Steps, 2)
	require.Equal(t, "succeeded", a.Steps[1].State)
	require.Equal(t, "ch_1", string(a.Steps[1].Result))
	require.Nil(t, a.UncertainStep())
	r = cli(t, pgArgs(store, "reconcile", "acct_3", "trip-done", "--step", "charge", "--done")...).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "no step's outcome is unknown", "settled once")

	// Settled as not done, in words.
	r = cli(t, pgArgs(store, "reconcile", "acct_3", "trip-not", "--step", "charge", "--not-done")...).requireCode(t, exitOK)
	require.Contains(t, r.out, `acct_3"/"trip-not": step 1 "charge" settled as not done (the next retry runs it again, as never started); the claim is abandoned again`)
	a = getJSON(t, store, "acct_3", "trip-not")
	require.True(t, a.Abandoned)
	require.Len(t, a.Steps, 1, "the start is taken back")

	// The retries resume: done, charge is replayed with the operator's result; not done,
	// charge runs again, as never started.
	act := newTrip("")
	require.Equal(t, "reserve-done,ch_1,notify-done", string(resume(t, "trip-done", act)))
	require.Equal(t, map[string]int{"notify": 1}, act.runs)
	act = newTrip("")
	require.Equal(t, "reserve-done,charge-done,notify-done", string(resume(t, "trip-not", act)))
	require.Equal(t, map[string]int{"charge": 1, "notify": 1}, act.runs)
	require.False(t, act.recovered["charge"], "not done: it runs as never started")
	a = getJSON(t, store, "acct_3", "trip-not")
	require.Equal(t, "succeeded", a.State)
	require.Len(t, a.Steps, 3)
}

func TestSteps(t *testing.T) {
	dir := t.TempDir()
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	fillFixture(t, db)
	fillSteps(t, db)
	require.NoError(t, db.Close())
	testSteps(t, []string{"--dir", dir}, func(t *testing.T, id string, a *trip) []byte {
		db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
		require.NoError(t, err)
		defer func() { require.NoError(t, db.Close()) }()
		r, err := db.Do(context.Background(), receipts.Key{Scope: "acct_3", ID: id}, fp, a.fn)
		require.NoError(t, err)
		return r.Result
	})
}

func TestPGSteps(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	db := openPGStore(t, dsn, schema, receipts.Options{})
	fillFixture(t, db)
	fillSteps(t, db)
	store := []string{"--pg", dsn, "--schema", schema}

	// Through a service's admin endpoint (--addr), get shows the same journal.
	srv := httptest.NewServer(http.StripPrefix("/admin/receipts", receiptadmin.Handler(db)))
	defer srv.Close()
	addr := []string{"--addr", srv.URL + "/admin/receipts"}
	want := getJSON(t, store, "acct_3", "trip-done")
	got := getJSON(t, addr, "acct_3", "trip-done")
	require.Len(t, got.Steps, 2)
	require.Equal(t, want.Steps, got.Steps)
	r := cli(t, pgArgs(addr, "get", "acct_3", "trip-done")...).requireCode(t, exitOK)
	require.Contains(t, r.out, "UNCERTAIN (started, outcome unknown)")

	testSteps(t, store, func(t *testing.T, id string, a *trip) []byte {
		r, err := db.Do(context.Background(), receipts.Key{Scope: "acct_3", ID: id}, fp, a.fn)
		require.NoError(t, err)
		return r.Result
	})
}
